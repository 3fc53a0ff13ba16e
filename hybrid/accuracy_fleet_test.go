package hybrid_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
)

// TestAccuracySixtyFourNodes is TestAccuracyEightNodes at 64 nodes (issue 21 item 3): 64 limiters at
// the library's defaults, each with its own client, on one real Redis, drive per-user style keys
// (bursts of 10 to 80) at 4× their limit and honest keys at 70–90% of theirs, spread over every
// node, for 3 s. Overloaded keys must stay within Burst + Rate·T + E, E from docs/accuracy.md's
// formula at N = 64; honest keys must see no false denials; Redis must count every admitted token.
//
// The load is paced (one goroutine per node, fleet.run): 64 nodes on a 2-core machine under -race.
// Each node's requests for a key are staggered (workload.stagger): a per-user key at 40 requests/s
// over 64 nodes is one request per node every 1.6 s, which unstaggered nodes would all send at the
// same instant.
func TestAccuracySixtyFourNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-second load test with 64 nodes; run without -short")
	}
	// The library's defaults but for the check timeout, as in TestAccuracyEightNodes: the bound assumes
	// Redis answers (docs/accuracy.md, "Assumptions"), and the default 5 ms is short for 64 nodes'
	// goroutines on 2 loaded cores under -race, where the failure policy would decide instead.
	accuracyFleet(t, 64, 3*time.Second, hybrid.WithCheckTimeout(250*time.Millisecond))
}

// accuracyFleet drives TestAccuracySixtyFourNodes's keys on nodes limiters (opts) for d and checks them,
// with E computed for nodes.
func accuracyFleet(t *testing.T, nodes int, d time.Duration, opts ...hybrid.Option) {
	srv, rdb := startRedis(t)
	f := newFleet(t, srv.Addr, nodes, opts...)
	// Traffic starts once every node is Ready, as a readiness check would let it: until a node has
	// counted its fleet (a second heartbeat for a node that finds others at its first), a new key's
	// first decision goes to Redis (docs/accuracy.md, "Assumptions").
	require.Eventually(t, func() bool {
		for _, l := range f.lims {
			if !l.Ready() {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond, "every node is ready")

	over := []workload{
		{keys: []string{"over:80:a", "over:80:b"}, limit: hybrid.Limit{Rate: 80, Burst: 80}},
		{keys: []string{"over:10:a"}, limit: hybrid.Limit{Rate: 10, Burst: 20}},
		{keys: []string{"over:40:a"}, limit: hybrid.Limit{Rate: 40, Burst: 10}},
	}
	for i := range over {
		over[i].demand, over[i].stagger = 4*over[i].limit.Rate, true
	}
	honest := []workload{
		{keys: []string{"honest:1000"}, limit: hybrid.Limit{Rate: 1000, Burst: 200}, demand: 900, stagger: true},
		{keys: []string{"honest:80"}, limit: hybrid.Limit{Rate: 80, Burst: 80}, demand: 64, stagger: true},
		{keys: []string{"honest:10"}, limit: hybrid.Limit{Rate: 10, Burst: 20}, demand: 7, stagger: true},
	}

	tl := newTally()
	stop := make(chan struct{})
	wg := f.run(t, stop, tl, append(append([]workload(nil), over...), honest...)...)
	time.Sleep(d)
	close(stop)
	wg.Wait()
	tl.end = time.Now()
	f.flush(t)

	elapsed := tl.end.Sub(tl.start).Seconds()
	t.Logf("N=%d T=%.3fs errors=%d max decision latency %v sources %v", nodes, elapsed, tl.errors, tl.maxLatency, tl.sources)
	assert.Zero(t, tl.errors)
	got := consumedByKey(t, rdb, hybrid.DefaultKeyPrefix)

	for _, w := range over {
		bound := overshootBound(hybrid.DefaultDriftThreshold, w.limit, nodes)
		allowed := float64(w.limit.Burst) + w.limit.Rate*elapsed
		for _, k := range w.keys {
			adm := tl.admitted[k]
			t.Logf("%s (Rate %g, Burst %d, 4×): demanded %d admitted %d = %.4f of Burst + Rate·T = %.0f; E = %.1f, limit %.4f; local %.2f%%",
				k, w.limit.Rate, w.limit.Burst, tl.demanded[k], adm, float64(adm)/allowed, allowed, bound,
				(allowed+bound)/allowed, localShare(tl.keySources[k]))
			assert.LessOrEqual(t, float64(adm), allowed+bound, "%s over Burst + Rate·T + E", k)
			// Liveness, loosely: on a loaded CI machine decisions can stall for a while, and the
			// callers themselves may fall so far behind that a key is not over its rate at all
			// (load average 9 on 2 cores: 194 requests in 3 s of a key at 80/s).
			live := min(w.limit.Rate*elapsed, float64(tl.demanded[k]))
			assert.GreaterOrEqual(t, float64(adm), 0.8*live, "%s: an overloaded key still gets its rate (or its demand, if less)", k)
			assertCounted(t, tl, k, got[k], 1)
		}
	}
	for _, w := range honest {
		for _, k := range w.keys {
			r := ratio(tl.admitted[k], tl.demanded[k])
			t.Logf("%s (Rate %g, Burst %d, %.2f×): demanded %d admitted %d (%.4f); local %.2f%%",
				k, w.limit.Rate, w.limit.Burst, w.demand/w.limit.Rate, tl.demanded[k], tl.admitted[k], r,
				localShare(tl.keySources[k]))
			assert.GreaterOrEqual(t, r, 0.99, "%s: false denials under honest load", k)
			assertCounted(t, tl, k, got[k], 1)
		}
	}

	// The fleet's own counters, summed over the nodes.
	var st hybrid.Stats
	for _, l := range f.lims {
		s := l.Stats()
		st.Local += s.Local
		st.LocalDenied += s.LocalDenied
		st.DenyCache += s.DenyCache
		st.Central += s.Central
		st.CentralDenied += s.CentralDenied
		st.FallbackAllowed += s.FallbackAllowed
		st.FallbackDenied += s.FallbackDenied
		st.RedisCommands += s.RedisCommands
		st.Unrecorded += s.Unrecorded
	}
	local := st.Local + st.LocalDenied + st.DenyCache
	total := local + st.Central + st.CentralDenied + st.FallbackAllowed + st.FallbackDenied
	t.Logf("Stats over %d nodes: decisions %d, local %.2f%% (local %d, local denied %d, deny-cache %d), central %d (denied %d), fallback %d (denied %d), script calls %d",
		nodes, total, 100*float64(local)/float64(max(total, 1)), st.Local, st.LocalDenied, st.DenyCache,
		st.Central+st.CentralDenied, st.CentralDenied, st.FallbackAllowed+st.FallbackDenied, st.FallbackDenied, st.RedisCommands)
	assert.Zero(t, st.Unrecorded, "every admitted token was recorded")
}

// localShare returns the percentage of decisions made without a Redis call (local and deny-cache).
func localShare(src map[outcome.Source]int64) float64 {
	var local, total int64
	for s, v := range src {
		total += v
		if s == outcome.SourceLocal || s == outcome.SourceDenyCache {
			local += v
		}
	}
	return 100 * float64(local) / float64(max(total, 1))
}
