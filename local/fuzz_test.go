package local

import (
	"testing"
)

// FuzzStore drives a store capped at 64 keys (one per shard) with arbitrary keys (empty, with NUL
// bytes, braces, long ones) and a random mix of inserts, local takes, failure-policy admissions and
// reconcile acknowledgements. Invariants checked after every step:
//   - Lookup and Insert return an entry for the key asked, never another key's;
//   - the store never holds more keys than its cap;
//   - an entry with consumption Redis has not acknowledged is never evicted, so nothing consumed
//     can be forgotten;
//   - Collect returns every entry with unacknowledged consumption.
//
// It runs its seeds in a plain go test; go test -fuzz=FuzzStore ./local/ explores further.
func FuzzStore(f *testing.F) {
	f.Add([]byte("\x00\x01a\x01\x01a\x03\x00\x02\x01a"))
	f.Add([]byte("\x00\x00\x00\x03{}}\x00\x02a\x00\x00\x01\x00"))
	f.Add([]byte("\x00\x05hello\x01\x05hello\x02\x05hello\x03\x00\x04\x05hello"))
	long := []byte{0, 200}
	for i := range 200 {
		long = append(long, byte(i))
	}
	f.Add(long)
	// Many distinct one-byte keys: evictions with pending entries around.
	var many []byte
	for i := range 255 {
		many = append(many, byte(i%3), 1, byte(i))
	}
	f.Add(many)
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxKeys = 64
		s, err := New(Config{MaxKeys: maxKeys})
		if err != nil {
			t.Fatal(err)
		}
		known := map[string]*Entry{} // the last entry Insert returned for each key
		for len(data) >= 2 {
			op, n := data[0]%5, int(data[1])
			data = data[2:]
			n = min(n, len(data))
			key := string(data[:n])
			data = data[n:]
			h := s.Hash(key)
			switch op {
			case 0: // insert, and give it an allowance as a reconcile would
				e := s.Insert(key, h, 10, 10, 1)
				if e == nil {
					break // the shard is full of pending entries
				}
				if e.Key() != key {
					t.Fatalf("Insert(%q) returned the entry of %q", key, e.Key())
				}
				if old := known[key]; old != nil && old != e && !old.Evicted() {
					t.Fatalf("Insert(%q) made a second live entry", key)
				}
				known[key] = e
				c := e.Next(1)
				e.Grant(Answer{Seq: c.Seq, Charged: e.Charged(), Credit: 3, Global: 3_000_000, Active: 1, At: 1})
			case 1: // a local take
				if e := s.Lookup(key, h); e != nil {
					e.TryTake(1)
				}
			case 2: // an admission by the failure policy
				if e := s.Lookup(key, h); e != nil {
					e.Add(1)
				}
			case 3: // a reconcile: collect the dirty entries and acknowledge them
				pending := map[*Entry]bool{}
				for _, e := range known {
					if e.Total() > e.Charged() {
						pending[e] = true
					}
				}
				for _, e := range s.Collect(nil) {
					delete(pending, e)
					c := e.Next(1)
					e.Grant(Answer{Seq: c.Seq, Charged: c.Cum, Credit: 3, Global: 3_000_000, Active: 1, At: 1})
				}
				for e := range pending {
					t.Fatalf("Collect missed %q with %d unacknowledged tokens", e.Key(), e.Total()-e.Charged())
				}
			case 4: // a lookup
				if e := s.Lookup(key, h); e != nil && e.Key() != key {
					t.Fatalf("Lookup(%q) returned the entry of %q", key, e.Key())
				}
			}
			if l := s.Len(); l > maxKeys {
				t.Fatalf("%d keys in a store capped at %d", l, maxKeys)
			}
			for k, e := range known {
				if e.Total() > e.Charged() && (e.Evicted() || s.Lookup(k, s.Hash(k)) != e) {
					t.Fatalf("%q was evicted with %d unacknowledged tokens", k, e.Total()-e.Charged())
				}
			}
		}
	})
}
