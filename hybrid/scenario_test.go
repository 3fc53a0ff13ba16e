package hybrid_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
)

// fakeClock is a clock that moves only when told to; safe for concurrent use.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// pinned is a limiter over miniredis with every clock pinned to one fake clock: the node's (through
// WithTestClock) and Redis TIME (miniredis's SetTime). The background loop's timer is real, so the
// sync interval is a minute: it never fires during a test, and tests call Flush instead. Redis lends
// no refill ahead (WithLeaseAdvance(0)), so the tables read as a plain token bucket's; the advance
// has its own tests (central's TestScriptLeaseAdvance, the accuracy tests).
type pinned struct {
	lim   *hybrid.Limiter
	m     *miniredis.Miniredis
	clock *fakeClock
}

func newPinned(t *testing.T, opts ...hybrid.Option) *pinned {
	t.Helper()
	p := &pinned{m: miniredis.RunT(t), clock: &fakeClock{now: time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)}}
	p.m.SetTime(p.clock.Now())
	rdb := redis.NewClient(&redis.Options{Addr: p.m.Addr()})
	lim, err := hybrid.New(rdb, append([]hybrid.Option{hybrid.WithCheckTimeout(time.Second),
		hybrid.WithSyncInterval(time.Minute), hybrid.WithTestClock(p.clock.Now), hybrid.WithLeaseAdvance(0)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = lim.Close(context.Background())
		_ = rdb.Close()
	})
	p.lim = lim
	awaitBans(t, lim) // from then on, new keys get cold-start credit
	return p
}

// advance moves both clocks by d.
func (p *pinned) advance(d time.Duration) { p.m.SetTime(p.clock.advance(d)) }

// step is one row of a scenario: after dt, take n tokens (or, with flush, reconcile first).
type step struct {
	dt         time.Duration
	flush      bool
	n          int64
	allowed    bool
	source     outcome.Source
	retryAfter time.Duration
	remaining  int64
}

// run plays steps on p's limiter for key under limit, in the style of x/time/rate's run(t, lim,
// []allow{...}); failures name the step.
func (p *pinned) run(t *testing.T, key string, limit hybrid.Limit, steps []step) {
	t.Helper()
	ctx := context.Background()
	for i, s := range steps {
		p.advance(s.dt)
		if s.flush {
			require.NoError(t, p.lim.Flush(ctx), "step %d", i)
		}
		d, err := p.lim.DecideN(ctx, key, limit, s.n)
		require.NoError(t, err, "step %d", i)
		if d.Allowed != s.allowed || d.Source != s.source || d.RetryAfter != s.retryAfter || d.Remaining != s.remaining {
			t.Errorf("step %d: after %v, AllowN(%d) = allowed %v source %v retry-after %v remaining %d; want %v %v %v %d",
				i, s.dt, s.n, d.Allowed, d.Source, d.RetryAfter, d.Remaining, s.allowed, s.source, s.retryAfter, s.remaining)
		}
	}
}

// TestDecisionScenario pins the decisions of one node on one key, step by step, with every clock
// fake (issue 13 item 5): no sleep, the same answers on every run. RetryAfter of a local denial is
// the refill time plus two sync intervals (here a minute each: see newPinned).
func TestDecisionScenario(t *testing.T) {
	p := newPinned(t)
	const minute = time.Minute
	p.run(t, "user:1", hybrid.Limit{Rate: 10, Burst: 10}, []step{
		// A new key: its cold-start credit (2 tokens) answers at once, Redis not asked yet.
		{n: 1, allowed: true, source: outcome.SourceLocal, remaining: 9},
		{n: 1, allowed: true, source: outcome.SourceLocal, remaining: 8},
		// Credit spent: a synchronous call charges the 2 and leases this node tokens for the third:
		// a lease of 3 more, sized to the node's demand so far (one request a second: the two
		// after the first in the key's first second, local.youngDemand), 4 left in the bucket.
		{n: 1, allowed: true, source: outcome.SourceCentral, remaining: 7},
		// Redis's answer (just now) said the bucket cannot cover 5 beyond the lease: denied
		// locally, no Redis call; come back once the bucket could hold 5 (0.1 s) and the syncer
		// has asked (two intervals).
		{n: 5, allowed: false, source: outcome.SourceLocal, retryAfter: 2*minute + 100*time.Millisecond, remaining: 4},
		{n: 5, allowed: false, source: outcome.SourceLocal, retryAfter: 2*minute + 100*time.Millisecond, remaining: 4},
		// The lease still answers small requests.
		{n: 1, allowed: true, source: outcome.SourceLocal, remaining: 6},
		{dt: 100 * time.Millisecond, n: 1, allowed: true, source: outcome.SourceLocal, remaining: 5},
		{dt: 500 * time.Millisecond, n: 1, allowed: true, source: outcome.SourceLocal, remaining: 4},
		// Lease spent; the answer's overdraft credit (1 token) answers one more.
		{dt: 1100 * time.Millisecond, n: 1, allowed: true, source: outcome.SourceLocal, remaining: 3},
		// Redis's answer is now over a second old: ask Redis, whose bucket has refilled to 9 of 10.
		{n: 10, allowed: false, source: outcome.SourceCentral, retryAfter: 100 * time.Millisecond, remaining: 9},
		// Redis's denial left this node no lease for the syncer to renew: two seconds on, the
		// request asks Redis again, and is covered.
		{dt: 2 * time.Second, flush: true, n: 3, allowed: true, source: outcome.SourceCentral, remaining: 7},
		// LeaseLife (8 s) has passed: what is left of the lease is written off; the credit answers
		// one request, and the next goes to Redis.
		{dt: 9 * time.Second, flush: true, n: 1, allowed: true, source: outcome.SourceLocal, remaining: 4},
		{n: 1, allowed: true, source: outcome.SourceCentral, remaining: 8},
	})
}
