package hybrid

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/local"
)

// TestStarvedTrustsAnEmptyBucketUntilItRefills (issue 21): Redis's answer that a key's bucket is
// empty lets a node deny the key locally for up to a second, but on a key whose demand, as Redis
// counted it, is under its rate only until the refill since that answer covers the request: the
// tokens are then in leases at other nodes or back in the bucket, not taken by the key's own load,
// and the decision goes to Redis (per-user keys of burst 10 on 8 nodes: 0.50–0.53% of an exact
// bucket's tokens denied, 0.41–0.44% so). A key at or over its rate is denied for the whole second,
// so that its denials cost no Redis command each.
func TestStarvedTrustsAnEmptyBucketUntilItRefills(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	var now atomic.Int64
	start := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return start.Add(time.Duration(now.Load())) }
	lim, err := New(rdb, WithTestClock(clock), WithSyncInterval(time.Minute), WithFleetBeat(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close(context.Background()) })
	limit := Limit{Rate: 5, Burst: 10} // a token refills in 200 ms
	for _, c := range []struct {
		key   string
		under bool
		// whether the node still denies locally 100 ms, 250 ms and 1.1 s after the answer
		at100, at250, at1100 bool
	}{
		{"under", true, true, false, false},
		{"over", false, true, true, false},
	} {
		e := lim.insert(c.key, lim.store.Hash(c.key), limit.Rate, limit.Burst, 0)
		if e == nil {
			t.Fatal("insert: no entry")
		}
		at := lim.mono()
		// Redis's answer: nothing charged to this node, the bucket empty.
		e.Grant(local.Answer{Global: 0, Active: 8, At: at, LeaseUntil: at + int64(8*time.Second), Under: c.under})
		if e.Under() != c.under {
			t.Fatalf("%s: Under() = %v after an answer with Under %v", c.key, e.Under(), c.under)
		}
		for _, step := range []struct {
			after time.Duration
			want  bool
		}{{100 * time.Millisecond, c.at100}, {250 * time.Millisecond, c.at250}, {1100 * time.Millisecond, c.at1100}} {
			now.Store(int64(step.after) + (at - 1))
			d, denied := lim.starved(e, limit, 1)
			if denied != step.want {
				t.Errorf("%s, %v after the answer: denied locally = %v, want %v", c.key, step.after, denied, step.want)
			}
			if denied && (d.Allowed || d.RetryAfter <= 0) {
				t.Errorf("%s: a local denial %+v, want not allowed with a RetryAfter", c.key, d)
			}
		}
		now.Store(0)
	}
}
