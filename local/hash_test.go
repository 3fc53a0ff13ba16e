package local

import (
	"strconv"
	"strings"
	"testing"
)

// TestHashSpreadsKeys checks Hash on keys of every length it treats apart (0 to 40 bytes: the byte
// cases, 4–8, 9–16, 17–32 and maphash beyond): no two of the 186,110 distinct keys share a 64-bit hash,
// the 64 shards and a shard's home slots are filled evenly (chi-square), and a second store hashes
// differently (random seeds).
func TestHashSpreadsKeys(t *testing.T) {
	s, err := New(Config{MaxKeys: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := New(Config{MaxKeys: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[uint64]string)
	dup := make(map[string]bool)
	var shards [numShards]int
	var homes [256]int
	same, total := 0, 0
	add := func(k string) {
		if dup[k] {
			return
		}
		dup[k] = true
		h := s.Hash(k)
		if h != s.Hash(k) {
			t.Fatalf("Hash(%q) changed between calls", k)
		}
		if prev, ok := seen[h]; ok && prev != k {
			t.Fatalf("Hash(%q) == Hash(%q) == %#x", k, prev, h)
		}
		seen[h] = k
		shards[h&(numShards-1)]++
		homes[home(h)&255]++
		if s2.Hash(k) == h {
			same++
		}
		total++
	}
	for n := 1; n <= 40; n++ {
		for i := range 5000 {
			d := strconv.Itoa(i)
			if len(d) > n {
				d = d[len(d)-n:]
			}
			add(strings.Repeat("k", n-len(d)) + d)
		}
	}
	if same > total/1000 {
		t.Errorf("%d of %d keys hash the same in two stores", same, total)
	}
	// A uniform hash gives a chi-square statistic near the bins less one (63 and 255, standard
	// deviations 11 and 23); six standard deviations above is a bias, not chance.
	if got, bound := chiSquare(shards[:], total), 63+6*11.2; got > bound {
		t.Errorf("shards: chi-square %.1f, want under %.0f (%v)", got, bound, shards)
	}
	if got, bound := chiSquare(homes[:], total), 255+6*22.6; got > bound {
		t.Errorf("home slots mod 256: chi-square %.1f, want under %.0f", got, bound)
	}
	if got := s.Hash(""); got != s.Hash("") {
		t.Errorf("Hash of the empty key changed")
	}
}

// chiSquare returns Pearson's statistic of counts (summing to total) against equal shares.
func chiSquare(counts []int, total int) float64 {
	want := float64(total) / float64(len(counts))
	x := 0.0
	for _, c := range counts {
		d := float64(c) - want
		x += d * d / want
	}
	return x
}

// TestTakeComparesEveryByte checks Take's key comparison: a key that differs from the entry's in
// any one byte, given the same hash (a collision), is not taken for it, at every length up to 40
// bytes. (It was written for a comparison by overlapping loads, tried in order to save Take's spills
// around runtime.memequal, and caught a version of it that skipped bytes; the comparison cost more
// instructions than it saved and was dropped.)
func TestTakeComparesEveryByte(t *testing.T) {
	s, err := New(Config{MaxKeys: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 40; n++ {
		a := make([]byte, n)
		for i := range a {
			a[i] = byte('a' + (i*7+n)%26)
		}
		key := string(a)
		h := s.Hash(key)
		if s.Insert(key, h, 1e9, 1e9, 1<<40) == nil {
			t.Fatalf("insert %q failed", key)
		}
		for p := range n {
			b := []byte(key)
			b[p] ^= 0x20
			if e := s.Take(string(b), h, 1e9, 1e9, 1); e != nil {
				t.Errorf("Take(%q) with the hash of %q took from %q's entry", b, key, e.Key())
			}
		}
		if e := s.Take(string(append([]byte(nil), key...)), h, 1e9, 1e9, 1); e == nil || e.Key() != key {
			t.Errorf("Take(%q) (a copy of the key) found no entry", key)
		}
	}
}
