package hybrid

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/local"
	"github.com/hybridrate/hybridrate/outcome"
)

// TestFallbackBucketCharges runs an outcome.LocalFallback bucket (one node's share: 25/s, capacity 50)
// through an outage and checks what of its admissions it charges as debt: the largest drawdown
// below where it would stand with no admissions, never more than its capacity.
func TestFallbackBucketCharges(t *testing.T) {
	t.Parallel()
	const r, b = 25.0, int64(50)
	for _, tc := range []struct {
		name           string
		s0             int64         // tokens at the start
		every          time.Duration // one request per
		outage         time.Duration
		admitted       int64 // want, ±1
		chargedAtLeast int64
		chargedAtMost  int64
	}{
		// Under its share (15/s of 25/s): the bucket stays near full; a token or two is charged.
		{"a key under its limit, from a full bucket", 50, time.Second / 15, 6 * time.Second, 90, 0, 2},
		// Over it (100/s): the bucket is emptied and stays empty; its capacity is charged, the
		// refill (150 tokens over 6 s) is not.
		{"a hot key, from an empty bucket", 0, time.Second / 100, 6 * time.Second, 150, 50, 50},
		{"a hot key, from a full bucket", 50, time.Second / 100, 6 * time.Second, 200, 50, 50},
		// A short outage on a busy key: the bucket never fills, every admission is charged, as
		// an exact bucket would have lost them.
		{"a short outage on a hot key", 0, time.Second / 100, time.Second, 25, 24, 25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(1_000_000, 0)
			fb := &fallbackBucket{start: start, lim: rate.NewLimiter(rate.Limit(r), int(b)), r: r, b: float64(b)}
			if k := int(b - tc.s0); k > 0 {
				fb.lim.AllowN(start, k)
			}
			fb.s0 = fb.lim.TokensAt(start)
			var admitted, charged int64
			for at := start; at.Sub(start) < tc.outage; at = at.Add(tc.every) {
				ok, _, excused := fb.take(at, r, b, 1)
				if !ok {
					continue
				}
				if excused < 0 || excused > 1 {
					t.Fatalf("at %v: excused %d of 1", at.Sub(start), excused)
				}
				admitted++
				charged += 1 - excused
			}
			if d := admitted - tc.admitted; d < -1 || d > 1 {
				t.Errorf("admitted %d, want %d±1", admitted, tc.admitted)
			}
			if charged < tc.chargedAtLeast || charged > tc.chargedAtMost {
				t.Errorf("charged %d of %d admitted, want %d to %d", charged, admitted, tc.chargedAtLeast, tc.chargedAtMost)
			}
			t.Logf("admitted %d, charged %d", admitted, charged)
		})
	}
}

// TestDirectRule (issue 21) walks a node's decisions of one key through Limiter.direct, the rule
// that sends them to Redis as one-off takes or as leasing takes, on a fleet of 512 against a key of
// burst 60 and 50/s: larger than what Redis lends of the key (60 + 50·1s), so a node's share of it
// at the uniform spread is under a token. The rule is local (no Redis call), so miniredis serves.
func TestDirectRule(t *testing.T) {
	_, rdb := redistest.Mini(t)
	lim, err := New(rdb, WithoutColdStart())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close(context.Background()) })
	limit := Limit{Rate: 50, Burst: 60}
	const sec = int64(time.Second)
	entry := func(key string) *local.Entry {
		return lim.store.Insert(key, lim.store.Hash(key), limit.Rate, limit.Burst, 0)
	}
	// decide runs the rule at each time (s) and returns how many decisions it sent as leasing takes.
	decideAt := func(limit Limit, e *local.Entry, times ...float64) (leasing int) {
		for _, at := range times {
			if !lim.direct(e, limit, int64(at*float64(sec))) {
				leasing++
			}
		}
		return leasing
	}
	decide := func(e *local.Entry, times ...float64) int { return decideAt(limit, e, times...) }
	// every returns the times from from to to (s), step apart.
	every := func(from, to, step float64) (ts []float64) {
		for at := from; at < to; at += step {
			ts = append(ts, at)
		}
		return ts
	}
	// grant applies a leasing take's answer at time at (s) that left the node extra tokens beyond
	// its request, as the limiter does after such a take.
	grant := func(e *local.Entry, at float64, extra int64) {
		c := e.Next(int64(at * float64(sec)))
		e.Grant(local.Answer{Seq: c.Seq, Charged: extra, At: int64(at * float64(sec))})
		e.SetThin(extra < thinLease)
	}

	t.Run("a fleet no larger than the burst leases", func(t *testing.T) {
		lim.fleetSize.Store(60)
		if got := decide(entry("small-fleet"), 1); got != 1 {
			t.Errorf("leasing takes = %d, want 1: on 60 nodes a burst of 60 gives each a token", got)
		}
	})
	lim.fleetSize.Store(512)
	t.Run("a node at the uniform share stays direct", func(t *testing.T) {
		// 0.3/s: three one-off takes within a LeaseLife, and more, all admitted.
		e := entry("uniform")
		if got := decide(e, 1, 4, 7, 8.5, 9, 12, 15); got != 0 {
			t.Errorf("leasing takes = %d, want 0 (the node's rate is under 2·2·50/60 a second)", got)
		}
	})
	t.Run("a key's home node leases", func(t *testing.T) {
		// 4/s, over 4·Rate/Burst = 3.3/s: the fourth one-off take within the first second asks.
		e := entry("home")
		if got := decide(e, 1, 1.25, 1.5); got != 0 {
			t.Fatalf("leasing takes = %d, want 0 for the first three", got)
		}
		if got := decide(e, 1.75); got != 1 {
			t.Errorf("the fourth decision in a second: leasing takes = %d, want 1", got)
		}
	})
	t.Run("thin answers hold the node direct, doubling", func(t *testing.T) {
		// A key of 5/s: a node that sees it once a second is over 4·Rate/Burst, and under
		// directBreak a LeaseLife.
		slow := Limit{Rate: 5, Burst: 60}
		e := entry("thin")
		// It asked for a lease at t=10 and was given nothing beyond its request (thin).
		grant(e, 10, 0)
		// For a LeaseLife (8 s) its decisions are one-off takes.
		if got := decideAt(slow, e, every(10.5, 18, 1)...); got != 0 {
			t.Errorf("within the first hold: leasing takes = %d, want 0", got)
		}
		if got := decideAt(slow, e, 18.5); got != 1 {
			t.Errorf("after the first hold (8 s): leasing takes = %d, want 1", got)
		}
		// A second thin answer in a row at t=19 holds it for two LeaseLives.
		grant(e, 19, 0)
		if got := decideAt(slow, e, every(19.5, 35, 1)...); got != 0 {
			t.Errorf("within the second hold (16 s): leasing takes = %d, want 0", got)
		}
		if got := decideAt(slow, e, 35.5); got != 1 {
			t.Errorf("after the second hold: leasing takes = %d, want 1", got)
		}
		// An answer that left the node a lease resets the run: the next thin one holds a LeaseLife.
		grant(e, 36, 5)
		if got := decideAt(slow, e, 37); got != 1 {
			t.Errorf("after a lease of 5: leasing takes = %d, want 1 (the node uses its leases)", got)
		}
		grant(e, 38, 0)
		if e.ThinRun() != 1 {
			t.Errorf("ThinRun = %d after a lease then a thin answer, want 1", e.ThinRun())
		}
	})
	t.Run("a node whose demand rose breaks the hold", func(t *testing.T) {
		e := entry("rising")
		grant(e, 50, 0)
		grant(e, 51, 0)
		grant(e, 52, 0) // a hold of four LeaseLives
		var times []float64
		for i := range directBreak - 1 {
			times = append(times, 53+float64(i)*0.1)
		}
		if got := decide(e, times...); got != 0 {
			t.Fatalf("leasing takes = %d within the hold, want 0", got)
		}
		if got := decide(e, 56); got != 1 {
			t.Errorf("the %dth one-off take within a LeaseLife: leasing takes = %d, want 1", directBreak, got)
		}
	})
	t.Run("strict mode never sends one-off takes", func(t *testing.T) {
		strict, err := New(rdb, WithDriftThreshold(0))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = strict.Close(context.Background()) }()
		strict.fleetSize.Store(512)
		e := strict.store.Insert("s", strict.store.Hash("s"), limit.Rate, limit.Burst, 0)
		if strict.direct(e, limit, sec) {
			t.Error("direct in strict mode")
		}
	})
}

// TestDeniedOneOffTakesStayDirect (issue 21): on a fleet larger than what Redis lends of a key, a
// node whose one-off takes of the key are denied keeps sending one-off takes (exact, and a denial
// writes nothing) rather than asking for leases: leases of a key over its rate wait at nodes that
// see it rarely, and on the fleet simulator's 4× overload on 512 nodes the fleet so admitted
// 0.923–0.926 of what an exact bucket admits (0.999 on one-off takes).
func TestDeniedOneOffTakesStayDirect(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) {
		ctx := context.Background()
		lim, err := New(rdb, WithoutColdStart(), WithFleetBeat(time.Hour), WithCheckTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lim.Close(context.Background()) })
		// The fleet registry's first beat counts this limiter alone; the next is an hour away.
		for deadline := time.Now().Add(10 * time.Second); !lim.Ready(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the limiter is not ready after 10 s")
			}
		}
		lim.fleetSize.Store(512)
		// 512 nodes > 5 + 50·1 s: thin; a node leases only at 4·50/5 = 40 one-off takes a second.
		limit := Limit{Rate: 50, Burst: 5}
		var admitted, denied int
		for range 10 {
			d, err := lim.Decide(ctx, "over", limit)
			if err != nil {
				t.Fatal(err)
			}
			if d.Source != outcome.SourceCentral {
				t.Fatalf("decision from %v, want a one-off take (central)", d.Source)
			}
			if d.Allowed {
				admitted++
			} else {
				denied++
			}
		}
		if denied == 0 {
			t.Fatalf("admitted %d of 10 on a burst of 5: the test needs denials", admitted)
		}
		fields, err := rdb.HKeys(ctx, central.BucketKey(DefaultKeyPrefix, "over")).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields {
			if central.IsNodeField(f) {
				t.Errorf("field %q: the node asked for a lease after %d denials; want one-off takes only", f, denied)
			}
		}
	})
}
