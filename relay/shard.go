package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/hybridrate/hybridrate/central"
)

// Upstream is what a child calls for its leases: a [Relay] in process, a [Remote] relay, or a
// [Sharded] set of them. Its method set is hybrid.Upstream's, so any Upstream can be given to
// hybrid.WithUpstream. Its methods are called from many goroutines at once: an implementation must
// be safe for concurrent use.
type Upstream interface {
	Reconcile(ctx context.Context, node string, updates []central.Update, out []central.State, errs []error) error
	Take(ctx context.Context, node string, u central.Update) (central.State, error)
}

// Sharded routes each key to one relay of a set, its owner, chosen by rendezvous hashing of the key
// over the relays' names: every child that names the same relays (in any order) sends a key to the
// same relay, so each key has one relay in front of Redis instead of one per host or zone.
//
// Sharding by key is the relay tier for keys that every process sees (per-user and per-IP keys on
// traffic that is not pinned): a relay per host would split such a key's burst into one pool per
// relay, each too small to last (a burst of 10 over 8 relays is about a token each), so most
// decisions would wait for Redis and some would be denied while other relays' pools sat idle. With
// one owner, the key's pool is the whole bucket's share, its children are served from memory, and
// Redis sees one node per key. A child's call to a key's owner is one network hop, as to a relay of
// its host; docs/design.md, "Any fleet size", compares the two layouts.
//
// When relays are added or removed, rendezvous hashing moves only the keys whose owner changed
// (about 1/n of them); a moved key's new owner is a new node of its bucket, and what the old one
// held is written off after a lease life, as for a restarted relay. Sharded does not fail over: a
// call to an owner that cannot answer fails, and the child's failure policy decides, as when Redis
// cannot answer. The zero Sharded is not usable: create one with [NewSharded]. It is immutable,
// safe for concurrent use.
type Sharded struct {
	names  []string
	ups    []Upstream
	hashes []uint64 // the names' hashes, mixed into each key's score
	pool   sync.Pool
}

// NewSharded returns an Upstream that sends each key to one of relays (name → upstream), by
// rendezvous hashing of the key over the names. Names must be non-empty and are what children must
// agree on (e.g. the relays' URLs or stable pod names); the upstreams may differ per child (an
// in-process relay for the child's own, Remote for the others). It does no I/O. Errors: no relays,
// or an empty name or nil upstream.
func NewSharded(relays map[string]Upstream) (*Sharded, error) {
	if len(relays) == 0 {
		return nil, errors.New("relay: NewSharded: no relays")
	}
	s := &Sharded{}
	for name := range relays {
		s.names = append(s.names, name)
	}
	slices.Sort(s.names)
	for _, name := range s.names {
		u := relays[name]
		if name == "" || u == nil {
			return nil, fmt.Errorf("relay: NewSharded: relay %q: empty name or nil upstream", name)
		}
		s.ups = append(s.ups, u)
		s.hashes = append(s.hashes, hashString(name))
	}
	s.pool.New = func() any { return new(shardCall) }
	return s, nil
}

// Owner returns the name of the relay that key is sent to. It does no I/O.
func (s *Sharded) Owner(key string) string { return s.names[s.owner(key)] }

// owner is the index of key's relay: the highest score of hash(key) mixed with each relay's hash.
func (s *Sharded) owner(key string) int {
	if len(s.ups) == 1 {
		return 0
	}
	k := hashString(key)
	best, bestScore := 0, uint64(0)
	for i, h := range s.hashes {
		if sc := mix(k ^ h); i == 0 || sc > bestScore {
			best, bestScore = i, sc
		}
	}
	return best
}

// Take sends u to its key's owner. Its I/O and errors are the owner's Take.
func (s *Sharded) Take(ctx context.Context, node string, u central.Update) (central.State, error) {
	return s.ups[s.owner(u.Key)].Take(ctx, node, u)
}

// shardCall holds one Reconcile's split of the updates, reused across calls.
type shardCall struct {
	idx  [][]int // per relay: the positions of its keys in the call
	ups  [][]central.Update
	outs [][]central.State
	errs [][]error
	err  []error
}

// Reconcile splits updates by owner and calls each owner with its keys (concurrently when there are
// several). A key whose owner failed gets that owner's error in errs, and Reconcile returns the
// first such error; the other owners' answers are in out as usual.
func (s *Sharded) Reconcile(ctx context.Context, node string, updates []central.Update, out []central.State, errs []error) error {
	if len(s.ups) == 1 {
		return s.ups[0].Reconcile(ctx, node, updates, out, errs)
	}
	c := s.pool.Get().(*shardCall)
	defer s.pool.Put(c)
	n := len(s.ups)
	if len(c.idx) != n {
		c.idx, c.ups, c.outs, c.errs, c.err = make([][]int, n), make([][]central.Update, n),
			make([][]central.State, n), make([][]error, n), make([]error, n)
	}
	for i := range n {
		c.idx[i], c.ups[i] = c.idx[i][:0], c.ups[i][:0]
		c.err[i] = nil
	}
	for j, u := range updates {
		o := s.owner(u.Key)
		c.idx[o] = append(c.idx[o], j)
		c.ups[o] = append(c.ups[o], u)
	}
	call := func(i int) {
		m := len(c.ups[i])
		c.outs[i] = slices.Grow(c.outs[i][:0], m)[:m]
		c.errs[i] = slices.Grow(c.errs[i][:0], m)[:m]
		clear(c.outs[i])
		clear(c.errs[i])
		c.err[i] = s.ups[i].Reconcile(ctx, node, c.ups[i], c.outs[i], c.errs[i])
	}
	busy := 0
	last := -1
	for i := range n {
		if len(c.ups[i]) > 0 {
			busy++
			last = i
		}
	}
	if busy == 1 {
		call(last)
	} else if busy > 1 {
		var wg sync.WaitGroup
		for i := range n {
			if len(c.ups[i]) > 0 {
				wg.Go(func() { call(i) })
			}
		}
		wg.Wait()
	}
	var first error
	for i := range n {
		for k, j := range c.idx[i] {
			out[j], errs[j] = c.outs[i][k], c.errs[i][k]
			if c.err[i] != nil && errs[j] == nil {
				errs[j] = c.err[i]
			}
		}
		if c.err[i] != nil && first == nil {
			first = fmt.Errorf("relay %s: %w", s.names[i], c.err[i])
		}
	}
	return first
}

// hashString is FNV-1a 64 of s: the same in every process and release (it decides which relay owns
// a key, which children on different versions must agree on).
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix is a 64-bit finalizer (SplitMix64's), spreading hash ^ relay hash into a uniform score.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
