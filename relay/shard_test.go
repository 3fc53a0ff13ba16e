package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/relay"
)

// recorder is an Upstream that records the keys it is sent and answers each with its own mark.
type recorder struct {
	mu   sync.Mutex
	keys []string
	mark int64
	fail error
}

func (r *recorder) Reconcile(_ context.Context, _ string, updates []central.Update, out []central.State, errs []error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, u := range updates {
		r.keys = append(r.keys, u.Key)
		out[i] = central.State{Status: central.StatusDone, Charged: r.mark}
		errs[i] = nil
	}
	return r.fail
}

func (r *recorder) Take(_ context.Context, _ string, u central.Update) (central.State, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, u.Key)
	return central.State{Status: central.StatusCovered, Charged: r.mark}, r.fail
}

func sharded(t *testing.T, names ...string) (*relay.Sharded, map[string]*recorder) {
	t.Helper()
	recs := map[string]*recorder{}
	ups := map[string]relay.Upstream{}
	for i, n := range names {
		recs[n] = &recorder{mark: int64(i + 1)}
		ups[n] = recs[n]
	}
	s, err := relay.NewSharded(ups)
	if err != nil {
		t.Fatal(err)
	}
	return s, recs
}

// TestShardedOwners: every child that names the same relays sends a key to the same one (whatever
// the order it learnt them in), keys spread evenly, and adding a relay moves only the keys it now
// owns (about 1/n of them).
func TestShardedOwners(t *testing.T) {
	names := []string{"http://relay-0:8080", "http://relay-1:8080", "http://relay-2:8080", "http://relay-3:8080"}
	a, _ := sharded(t, names...)
	b, _ := sharded(t, names[3], names[1], names[0], names[2])
	more, _ := sharded(t, append(names, "http://relay-4:8080")...)
	count := map[string]int{}
	moved := 0
	const keys = 20000
	for i := range keys {
		k := fmt.Sprintf("user:%d", i)
		o := a.Owner(k)
		if b.Owner(k) != o {
			t.Fatalf("key %q: owner %q in one child, %q in another", k, o, b.Owner(k))
		}
		count[o]++
		if m := more.Owner(k); m != o {
			if m != "http://relay-4:8080" {
				t.Fatalf("key %q moved from %q to %q, not to the new relay", k, o, m)
			}
			moved++
		}
	}
	for _, n := range names {
		if c := count[n]; c < keys/4*85/100 || c > keys/4*115/100 {
			t.Errorf("relay %s owns %d of %d keys, want %d ± 15%%", n, c, keys, keys/4)
		}
	}
	if moved < keys/5*80/100 || moved > keys/5*120/100 {
		t.Errorf("a fifth relay took %d of %d keys, want about a fifth", moved, keys)
	}
}

// TestShardedReconcileSplits: a round's keys go to their owners, answers come back in the round's
// order, and a failed owner fails its own keys only.
func TestShardedReconcileSplits(t *testing.T) {
	s, recs := sharded(t, "a", "b", "c")
	ups := make([]central.Update, 300)
	for i := range ups {
		ups[i] = central.Update{Key: fmt.Sprintf("k%d", i), Limit: lim, Inc: 1}
	}
	out := make([]central.State, len(ups))
	errs := make([]error, len(ups))
	if err := s.Reconcile(context.Background(), "child", ups, out, errs); err != nil {
		t.Fatal(err)
	}
	marks := map[string]int64{"a": 1, "b": 2, "c": 3}
	for i, u := range ups {
		if want := marks[s.Owner(u.Key)]; out[i].Charged != want || errs[i] != nil {
			t.Fatalf("key %s: answer %+v, %v; want its owner %s's", u.Key, out[i], errs[i], s.Owner(u.Key))
		}
	}
	total := 0
	for _, r := range recs {
		total += len(r.keys)
		for _, k := range r.keys {
			if marks[s.Owner(k)] != r.mark {
				t.Fatalf("key %s sent to a relay that does not own it", k)
			}
		}
	}
	if total != len(ups) {
		t.Fatalf("%d keys sent for %d", total, len(ups))
	}

	down := errors.New("relay b: connection refused")
	recs["b"].fail = down
	clear(out)
	clear(errs)
	err := s.Reconcile(context.Background(), "child", ups, out, errs)
	if !errors.Is(err, down) {
		t.Fatalf("Reconcile with relay b down: %v", err)
	}
	for i, u := range ups {
		owner := s.Owner(u.Key)
		if (owner == "b") != errors.Is(errs[i], down) {
			t.Fatalf("key %s (owner %s): error %v", u.Key, owner, errs[i])
		}
		if owner != "b" && out[i].Charged != marks[owner] {
			t.Fatalf("key %s (owner %s): answer %+v lost", u.Key, owner, out[i])
		}
	}
	if _, err := s.Take(context.Background(), "child", ups[0]); (s.Owner(ups[0].Key) == "b") != errors.Is(err, down) {
		t.Fatalf("Take of %s (owner %s): %v", ups[0].Key, s.Owner(ups[0].Key), err)
	}
	if _, err := relay.NewSharded(nil); err == nil {
		t.Error("NewSharded with no relays: no error")
	}
	if _, err := relay.NewSharded(map[string]relay.Upstream{"": &recorder{}}); err == nil {
		t.Error("NewSharded with an empty name: no error")
	}
}

// TestShardedChildrenOnRealRedis: children that shard their keys over two relays put each key's
// bucket behind one relay: Redis holds one node record per key, the owner's, and the children's
// admissions stay within an exact bucket plus one lendable amount.
func TestShardedChildrenOnRealRedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const prefix = "rs1"
	r0, r1 := newRelay(t, rdb, prefix, "relay-0"), newRelay(t, rdb, prefix, "relay-1")
	runRelays(t, r0, r1)
	s, err := relay.NewSharded(map[string]relay.Upstream{"relay-0": r0, "relay-1": r1})
	if err != nil {
		t.Fatal(err)
	}
	kids := newChildren(t, rdb, prefix, "child", 6, []hybrid.Upstream{s})
	awaitReady(kids) // as TestRelayHoldsTheLimitAcrossItsChildren: cold-start credit from the start
	limit := hybrid.Limit{Rate: 20, Burst: 10}
	keys := []string{"user:1", "user:2", "user:3", "user:4", "user:5", "user:6", "user:7", "user:8"}
	admitted := make([]int, len(keys))
	var mu sync.Mutex
	// Every child sends every key 10 requests/s: 60/s a key, three times its rate.
	el := drive(t, kids, 100*time.Millisecond, 1500*time.Millisecond, keys, limit, func(i int, d hybrid.Decision) {
		if d.Allowed {
			mu.Lock()
			admitted[i]++
			mu.Unlock()
		}
	})
	exact := float64(limit.Burst) + limit.Rate*el
	lendable := float64(limit.Burst) + limit.Rate*hybrid.LeaseAdvance.Seconds()
	for i, k := range keys {
		if got := float64(admitted[i]); got > exact+lendable || got < 0.6*limit.Rate*el {
			t.Errorf("key %s: admitted %v, exact bucket %.0f (+ %.0f lendable)", k, got, exact, lendable)
		}
		nodes := nodeRecords(t, rdb, prefix, k)
		if len(nodes) != 1 || nodes[0] != s.Owner(k) {
			t.Errorf("key %s: node records %v, want its owner %s's only", k, nodes, s.Owner(k))
		}
	}
	t.Logf("admitted %v over %.2fs (exact bucket %.0f)", admitted, el, exact)
}
