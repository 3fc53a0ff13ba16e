package hybrid_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// TestAccuracyEightNodes is DESIGN.md invariant 1 on real Redis: 8 nodes, each with its own client,
// drive some keys at 4× their limit and others at 90% of it, at the same time. Overloaded keys must
// stay within Burst + Rate·T + E (docs/accuracy.md); honest keys must see no false denials; and
// Redis's consumed counter must equal what the nodes admitted, token for token.
func TestAccuracyEightNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-second load test; run without -short")
	}
	t.Run("defaults", func(t *testing.T) { accuracyEightNodes(t, hybrid.LeaseAdvance) })
	t.Run("no lease advance", func(t *testing.T) { accuracyEightNodes(t, 0) })
}

func accuracyEightNodes(t *testing.T, advance time.Duration) {
	srv, rdb := startRedis(t)
	const nodes = 8
	interval := 20 * time.Millisecond
	drift := 0.1
	f := newFleet(t, srv.Addr, nodes, hybrid.WithSyncInterval(interval), hybrid.WithDriftThreshold(drift),
		hybrid.WithCheckTimeout(250*time.Millisecond), hybrid.WithLeaseAdvance(advance))
	limit := hybrid.Limit{Rate: 1000, Burst: 200}
	over := workload{keys: []string{"over:a", "over:b", "over:c"}, limit: limit, demand: 4 * limit.Rate}
	honest := workload{keys: []string{"honest:a", "honest:b"}, limit: limit, demand: 0.9 * limit.Rate}

	tl := newTally()
	stop := make(chan struct{})
	wg := f.run(t, stop, tl, over, honest)
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	tl.end = time.Now()
	f.flush(t)

	elapsed := tl.end.Sub(tl.start).Seconds()
	bound := overshootBoundAdvance(drift, limit, nodes, advance)
	allowed := float64(limit.Burst) + limit.Rate*elapsed
	t.Logf("T=%.3fs allowance=%.0f bound E=%.1f sources=%v errors=%d", elapsed, allowed, bound, tl.sources, tl.errors)
	assert.Zero(t, tl.errors)
	for _, k := range over.keys {
		adm := tl.admitted[k]
		t.Logf("%s: demanded %d admitted %d = %.4f of allowance (limit with E: %.4f)", k, tl.demanded[k], adm,
			float64(adm)/allowed, (allowed+bound)/allowed)
		assert.LessOrEqual(t, float64(adm), allowed+bound, "%s over Burst + Rate·T + E", k)
		// Liveness, loosely: on a loaded CI machine decisions can stall for a while.
		assert.GreaterOrEqual(t, float64(adm), 0.8*limit.Rate*elapsed, "%s: an overloaded key still gets its rate", k)
		assert.Equal(t, adm, consumedInRedis(t, rdb, k), "%s: Redis accounts for every admitted token", k)
	}
	for _, k := range honest.keys {
		r := ratio(tl.admitted[k], tl.demanded[k])
		t.Logf("%s: demanded %d admitted %d (%.4f)", k, tl.demanded[k], tl.admitted[k], r)
		assert.GreaterOrEqual(t, r, 0.99, "%s: false denials under honest load", k)
		assert.Equal(t, tl.admitted[k], consumedInRedis(t, rdb, k), k)
	}
}

// TestRedisCommandsPerThousandDecisions measures, from Redis's own INFO commandstats, the commands
// 8 nodes send per 1,000 decisions on hot keys under honest load (DESIGN.md target: ≤ 10; a central
// limiter sends 1,000). Redis also counts the commands scripts run internally (hget, hset, time…);
// they are reported separately: the client-issued commands are what crosses the network.
func TestRedisCommandsPerThousandDecisions(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-second load test; run without -short")
	}
	srv, _ := startRedis(t)
	const nodes = 8
	f := newFleet(t, srv.Addr, nodes, hybrid.WithCheckTimeout(250*time.Millisecond))
	// Hot keys: 4 keys at 15,000/s, driven at 90% (about 54,000 decisions/s over the fleet, so about
	// 135 decisions per node per 20ms sync interval).
	limit := hybrid.Limit{Rate: 15000, Burst: 5000}
	w := workload{keys: []string{"hot:1", "hot:2", "hot:3", "hot:4"}, limit: limit, demand: 0.9 * limit.Rate}
	srv.ResetStats(t)
	tl := newTally()
	stop := make(chan struct{})
	wg := f.run(t, stop, tl, w)
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	f.flush(t)
	stats := srv.CommandStats(t)
	var decisions int64
	for _, v := range tl.demanded {
		decisions += v
	}
	client, internal := splitCommandStats(stats)
	per1000 := float64(client) * 1000 / float64(decisions)
	t.Logf("decisions %d, client commands %d (%.2f per 1000), script-internal commands %d, stats %v, sources %v",
		decisions, client, per1000, internal, stats, tl.sources)
	require.Positive(t, decisions)
	assert.LessOrEqual(t, per1000, 10.0, "Redis commands per 1,000 decisions")
	var admitted int64
	for _, v := range tl.admitted {
		admitted += v
	}
	assert.GreaterOrEqual(t, ratio(admitted, decisions), 0.99, "honest load is admitted")
}

// splitCommandStats separates commands clients sent from commands scripts ran inside Redis.
func splitCommandStats(stats map[string]int64) (client, internal int64) {
	for cmd, n := range stats {
		switch {
		case cmd == "config|resetstat" || cmd == "info": // the test's own
		case cmd == "evalsha" || cmd == "eval" || strings.HasPrefix(cmd, "script") || cmd == "subscribe" ||
			cmd == "ping" || cmd == "hello" || strings.HasPrefix(cmd, "client") || cmd == "config|get":
			client += n
		default:
			internal += n
		}
	}
	return client, internal
}

// TestRedisKilledMidLoad is DESIGN.md invariant 2: Redis is killed under load and restarted on the
// same port (losing all data). No panic and no error; while it is down decisions follow the failure
// policy and none waits longer than the sync timeout; afterwards the consumed totals in Redis account
// for every admitted token.
func TestRedisKilledMidLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-second fault-injection test; run without -short")
	}
	srv, rdb := startRedis(t)
	const nodes = 4
	syncTimeout := 20 * time.Millisecond
	f := newFleet(t, srv.Addr, nodes, hybrid.WithCheckTimeout(syncTimeout), hybrid.WithFlushTimeout(100*time.Millisecond))
	limit := hybrid.Limit{Rate: 500, Burst: 100}
	w := workload{keys: []string{"k1", "k2", "k3"}, limit: limit, demand: 2 * limit.Rate}

	tl := newTally()
	stop := make(chan struct{})
	wg := f.run(t, stop, tl, w)
	time.Sleep(time.Second)

	// Freeze writes so that what Redis has applied is known, then kill it: the paused scripts never run.
	srv.Do(t, "CLIENT", "PAUSE", "10000", "WRITE")
	before := map[string]int64{}
	for _, k := range w.keys {
		before[k] = consumedInRedis(t, rdb, k)
	}
	srv.Kill(t)
	time.Sleep(1500 * time.Millisecond)
	srv.Restart(t)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	f.flush(t)

	t.Logf("sources %v, max decision latency %v, errors %d", tl.sources, tl.maxLatency, tl.errors)
	assert.Zero(t, tl.errors, "no decision failed")
	assert.Positive(t, tl.sources[outcome.SourceFallback], "the failure policy decided while Redis was down")
	// The bound is the sync timeout; the slack absorbs scheduling delays of a loaded -race run (the
	// measured maximum is logged above, typically the sync timeout plus a millisecond or two).
	assert.Less(t, tl.maxLatency, syncTimeout+redistest.Stretch(250*time.Millisecond), "no decision waits much beyond the sync timeout")
	for _, k := range w.keys {
		after := consumedInRedis(t, rdb, k)
		assert.Equal(t, tl.admitted[k], before[k]+after,
			"%s: admitted = applied before the kill (%d) + applied after the restart (%d)", k, before[k], after)
	}
	for i, l := range f.lims {
		st := l.Stats()
		assert.Zero(t, st.Unrecorded, "node %d", i)
		assert.Zero(t, st.Pending, "node %d", i)
	}
}

func TestBanReachesEveryNode(t *testing.T) {
	srv, _ := startRedis(t)
	f := newFleet(t, srv.Addr, 3)
	ctx := context.Background()
	limit := hybrid.PerSecond(1000)
	for _, l := range f.lims {
		d, err := l.Decide(ctx, "abuser", limit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.NoError(t, f.lims[0].Ban(ctx, "abuser", time.Minute))
	for i, l := range f.lims {
		require.Eventually(t, func() bool {
			d, err := l.Decide(ctx, "abuser", limit)
			return err == nil && !d.Allowed && d.Source == outcome.SourceDenyCache && d.RetryAfter > 50*time.Second
			// Pub/Sub carries it at once; a node whose subscription was not up yet (a loaded
			// machine) reads it from the change log within banRefresh (10 s).
		}, 15*time.Second, 5*time.Millisecond, "node %d", i)
	}
	require.NoError(t, f.lims[1].Unban(ctx, "abuser"))
	for i, l := range f.lims {
		require.Eventually(t, func() bool {
			d, err := l.Decide(ctx, "abuser", limit)
			return err == nil && d.Allowed
		}, 2*time.Second, 5*time.Millisecond, "node %d", i)
	}
	// A node that starts later learns the bans in force.
	require.NoError(t, f.lims[0].Ban(ctx, "other", time.Minute))
	late := newFleet(t, srv.Addr, 1)
	require.Eventually(t, func() bool {
		d, err := late.lims[0].Decide(ctx, "other", limit)
		return err == nil && !d.Allowed && d.Source == outcome.SourceDenyCache
	}, 2*time.Second, 5*time.Millisecond)
}

// TestAccuracyShapes checks docs/accuracy.md's bound, and that honest load is admitted, on the key
// shapes issue 10 names, on real Redis with 8 nodes at the library's defaults: many sparse keys,
// sparse keys pinned 90% to a home node, a flood of keys no node has seen (every node admits its
// cold-start credit at once), and a fleet that grows from 2 to 8 nodes while a key is over its limit.
// Every case also checks that Redis counted every admitted token.
func TestAccuracyShapes(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-second load tests; run without -short")
	}
	const nodes = 8
	sparse := hybrid.Limit{Rate: 10, Burst: 20}
	for _, tc := range []struct {
		name     string
		honest   workload // admitted/demanded ≥ 0.99
		over     workload // admitted ≤ Burst + Rate·T + E
		grow     bool     // 2 nodes first, 6 more after a second
		duration time.Duration
	}{
		{name: "sparse keys", duration: 3 * time.Second,
			honest: workload{keys: keyNames("sparse:h:", 200), limit: sparse, demand: 0.5 * sparse.Rate},
			over:   workload{keys: keyNames("sparse:o:", 20), limit: sparse, demand: 4 * sparse.Rate}},
		{name: "sticky sparse keys", duration: 3 * time.Second,
			honest: workload{keys: keyNames("sticky:h:", 200), limit: sparse, demand: 0.5 * sparse.Rate, affinity: 0.9},
			over:   workload{keys: keyNames("sticky:o:", 20), limit: sparse, demand: 4 * sparse.Rate, affinity: 0.9}},
		{name: "a flood of new keys", duration: 1500 * time.Millisecond,
			over: workload{keys: keyNames("cold:", 500), limit: hybrid.Limit{Rate: 10, Burst: 50}, demand: 400}},
		{name: "the fleet grows from 2 to 8 nodes", grow: true, duration: 3 * time.Second,
			over: workload{keys: []string{"grow:a", "grow:b"}, limit: hybrid.Limit{Rate: 500, Burst: 100}, demand: 2000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, rdb := startRedis(t)
			first, later := newFleet(t, srv.Addr, nodes), (*fleet)(nil)
			if tc.grow {
				later = &fleet{lims: first.lims[2:]}
				first = &fleet{lims: first.lims[:2]}
			}
			var ws []workload
			for _, w := range []workload{tc.honest, tc.over} {
				if len(w.keys) > 0 {
					ws = append(ws, w)
				}
			}
			tl, tl2 := newTally(), newTally()
			stop := make(chan struct{})
			wg := first.run(t, stop, tl, ws...)
			var wg2 *sync.WaitGroup
			if later != nil {
				time.Sleep(time.Second)
				// The late nodes' share of the demand: 6 of 8 nodes' worth.
				w := tc.over
				w.demand = tc.over.demand * 6 / 8
				wg2 = later.run(t, stop, tl2, w)
			}
			time.Sleep(tc.duration - time.Since(tl.start))
			close(stop)
			wg.Wait()
			if wg2 != nil {
				wg2.Wait()
			}
			tl.end = time.Now()
			all := &fleet{lims: append(append([]*hybrid.Limiter(nil), first.lims...), lims(later)...)}
			all.flush(t)
			tl.mu.Lock()
			tl.addLocked(tl2) // the late nodes' counts
			tl.mu.Unlock()
			assert.Zero(t, tl.errors, "errors of both fleets")
			elapsed := tl.end.Sub(tl.start).Seconds()
			bound := overshootBound(hybrid.DefaultDriftThreshold, tc.over.limit, nodes)
			allowed := float64(tc.over.limit.Burst) + tc.over.limit.Rate*elapsed
			var worst float64
			for _, k := range tc.over.keys {
				adm := float64(tl.admitted[k])
				worst = max(worst, adm/allowed)
				assert.LessOrEqual(t, adm, allowed+bound, "%s over Burst + Rate·T + E", k)
			}
			var hAdm, hDem int64
			for _, k := range tc.honest.keys {
				hAdm += tl.admitted[k]
				hDem += tl.demanded[k]
			}
			got := consumedByKey(t, rdb, hybrid.DefaultKeyPrefix)
			for _, w := range ws {
				for _, k := range w.keys {
					assertCounted(t, tl, k, got[k], 1)
				}
			}
			var local, total int64
			for s, v := range tl.sources {
				total += v
				if s == outcome.SourceLocal || s == outcome.SourceDenyCache {
					local += v
				}
			}
			t.Logf("T=%.2fs: over keys at most %.3f of Burst + Rate·T (bound %.3f); honest admitted %d of %d; local %.2f%% of %d",
				elapsed, worst, (allowed+bound)/allowed, hAdm, hDem, 100*float64(local)/float64(max(total, 1)), total)
			if hDem > 0 {
				assert.GreaterOrEqual(t, ratio(hAdm, hDem), 0.99, "honest load is admitted")
			}
		})
	}
}

func lims(f *fleet) []*hybrid.Limiter {
	if f == nil {
		return nil
	}
	return f.lims
}

// TestOneKeyTwoLimits: one key used with two limits at once (Rate 100 from one caller, Rate 10 from
// another, on two nodes). Since key layout v5 (issue 23, item 2) a key has one bucket whatever its
// limit (until then each limit had its own, issue 11 item 8): both callers count in it, each call
// applies the limit it carries, and the key is held to the larger limit at most, with every token
// counted once in Redis.
func TestOneKeyTwoLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-second load test; run without -short")
	}
	srv, rdb := startRedis(t)
	f := newFleet(t, srv.Addr, 2)
	fast, slow := hybrid.Limit{Rate: 100, Burst: 100}, hybrid.Limit{Rate: 10, Burst: 10}
	ctx := context.Background()
	var fastAdm, slowAdm atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range []struct {
		limit hybrid.Limit
		adm   *atomic.Int64
	}{{fast, &fastAdm}, {slow, &slowAdm}} {
		for _, lim := range f.lims {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond): // about 1,000 requests/s per caller and node
					}
					if d, err := lim.Decide(ctx, "shared", c.limit); err == nil && d.Allowed {
						c.adm.Add(1)
					}
				}
			}()
		}
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	f.flush(t)
	total := fastAdm.Load() + slowAdm.Load()
	allowed := float64(fast.Burst) + fast.Rate*elapsed
	bound := overshootBound(hybrid.DefaultDriftThreshold, fast, 2)
	t.Logf("rate 100: admitted %d, rate 10: admitted %d; together %.3f of the larger limit's Burst + Rate·T (bound %.3f)",
		fastAdm.Load(), slowAdm.Load(), float64(total)/allowed, (allowed+bound)/allowed)
	assert.LessOrEqual(t, float64(total), allowed+bound, "one bucket: at most the larger limit")
	assert.GreaterOrEqual(t, float64(total), 0.8*slow.Rate*elapsed, "the smaller limit's rate at least")
	assert.Equal(t, total, consumedInRedis(t, rdb, "shared"), "Redis counts both callers in one bucket")
}

// TestLeaseAdvanceBurst pins the price of the lease advance: a key that has run under its rate holds
// leases that include refill lent ahead, so a sudden burst can take up to Burst + Rate·advance at
// once (in fact Burst + W·advance, W the demand before it); with no advance it takes at most Burst
// (plus what refills meanwhile, the node's overdraft credit, and what the node still holds of a
// lease it took before the bucket refilled to its burst: term 1 of docs/accuracy.md's bound; a
// single node at half its rate held 4 tokens of 8 so). A key that was quiet has no demand
// to lend ahead for: its first burst takes at most Burst, whatever the advance.
func TestLeaseAdvanceBurst(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-second test; run without -short")
	}
	limit := hybrid.Limit{Rate: 4, Burst: 8}
	for _, tc := range []struct {
		name    string
		advance time.Duration
	}{{"no advance", 0}, {"default advance", hybrid.LeaseAdvance}} {
		t.Run(tc.name, func(t *testing.T) {
			_, rdb := startRedis(t)
			lim := newLimiter(t, rdb, hybrid.WithLeaseAdvance(tc.advance), hybrid.WithCheckTimeout(time.Second))
			ctx := context.Background()
			// Two seconds at 2/s, half the rate: leases sized to the demand, the bucket full.
			for range 4 {
				d, err := lim.Decide(ctx, "b", limit)
				require.NoError(t, err)
				require.True(t, d.Allowed)
				time.Sleep(500 * time.Millisecond)
			}
			// Then 40 at once. What this node still holds of its lease was taken from the bucket
			// before it refilled to its burst: it comes on top (docs/accuracy.md, "The bound", term 1).
			held := int(lim.Unused("b"))
			start := time.Now()
			admitted := 0
			for range 40 {
				d, err := lim.Decide(ctx, "b", limit)
				require.NoError(t, err)
				if d.Allowed {
					admitted++
				}
			}
			refill := int(limit.Rate*time.Since(start).Seconds()) + 1
			credit := int(max(1, hybrid.DefaultDriftThreshold*float64(limit.Burst))) // the overdraft of one node
			most := int(limit.Burst) + int(limit.Rate*tc.advance.Seconds()) + refill + credit + held
			t.Logf("advance %v: a burst of 40 took %d (at most Burst + Rate·advance + refill + credit + lease held %d = %d)",
				tc.advance, admitted, held, most)
			assert.LessOrEqual(t, admitted, most)
			assert.GreaterOrEqual(t, admitted, int(limit.Burst)-2, "the burst is there (less what the last 0.5 s took)")

			// A key never used before: 40 at once take the burst, no refill lent ahead.
			start = time.Now()
			admitted = 0
			for range 40 {
				d, err := lim.Decide(ctx, "quiet", limit)
				require.NoError(t, err)
				if d.Allowed {
					admitted++
				}
			}
			refill = int(limit.Rate*time.Since(start).Seconds()) + 1
			// Its cold-start credit is charged to the bucket like any consumption: no term of its own.
			most = int(limit.Burst) + refill + credit
			t.Logf("advance %v: a quiet key's burst of 40 took %d (at most Burst + refill + credit = %d)", tc.advance, admitted, most)
			assert.LessOrEqual(t, admitted, most)
		})
	}
}

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

// TestHotKeySplitCountsExactly (issue 24): eight goroutines on each of two limiters decide on one hot
// key whose allowance each node has split per core (local.Entry.Split: contention splits it; the
// test splits it at once where contention has not yet), while the syncer reports every 20ms; after a
// flush, Redis counts exactly the tokens the two nodes admitted, and each node's Stats().Local the
// decisions it made locally.
func TestHotKeySplitCountsExactly(t *testing.T) {
	srv, rdb := startRedis(t)
	f := newFleet(t, srv.Addr, 2, hybrid.WithSyncInterval(20*time.Millisecond))
	limit := hybrid.Limit{Rate: 1e9, Burst: 1e9} // never exhausted: every decision a take from the lease
	var (
		admitted, local [2]atomic.Int64
		stop            atomic.Bool
		wg              sync.WaitGroup
	)
	for n, lim := range f.lims {
		for range 8 {
			wg.Go(func() {
				ctx := context.Background()
				for !stop.Load() {
					d, err := lim.DecideN(ctx, "hot", limit, 1+int64(n))
					if err == nil && d.Allowed {
						admitted[n].Add(1 + int64(n))
						if d.Source == outcome.SourceLocal {
							local[n].Add(1)
						}
					}
				}
			})
		}
	}
	sum := func() int64 { return admitted[0].Load() + admitted[1].Load() }
	for n, lim := range f.lims {
		require.Eventually(t, func() bool { return admitted[n].Load() > 0 }, 10*time.Second, time.Millisecond)
		if hybrid.SplitKey(lim, "hot") {
			t.Logf("node %d: split by the test (contention had not yet)", n)
		}
		assert.EqualValues(t, 1, hybrid.Splits(lim), "node %d", n)
	}
	// Then many reports, grants, refills and drains on the split key: 300,000 tokens more.
	base := sum()
	assert.Eventually(t, func() bool { return sum() > base+300_000 }, 20*time.Second, time.Millisecond)
	stop.Store(true)
	wg.Wait()
	f.flush(t)
	for n, lim := range f.lims {
		assert.Equal(t, local[n].Load(), lim.Stats().Local, "node %d: every local decision counted once", n)
	}
	assert.Equal(t, sum(), consumedByKey(t, rdb, hybrid.DefaultKeyPrefix)["hot"], "Redis counts exactly the tokens admitted")
}
