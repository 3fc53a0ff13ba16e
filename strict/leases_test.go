package strict

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
)

// fakeClock is a clock the tests move by hand.
type fakeClock struct{ us atomic.Int64 }

func (c *fakeClock) now() time.Time      { return time.UnixMicro(c.us.Load()) }
func (c *fakeClock) add(d time.Duration) { c.us.Add(d.Microseconds()) }

// leaseT0 is a multiple of an hour, in µs: the start of an hour window.
const leaseT0 = int64(1763769600) * 1_000_000

// upstreamModel is envoyproxy/ratelimit's count of one window: every hit counts; a request is over
// when the count after it is above the limit; a read (n = 0) is over when the count already is.
type upstreamModel struct{ count, limit int64 }

func (m *upstreamModel) charge(n int64) (allowed bool, remaining, excess int64) {
	m.count += n
	if m.count > m.limit {
		return false, 0, m.count - m.limit
	}
	return true, m.limit - m.count, 0
}

func newLeased(t *testing.T, rdb redis.UniversalClient, clk *fakeClock, life time.Duration) *Limiter {
	t.Helper()
	return newTestStrict(t, rdb, WithClock(clk.now), WithWindowLeases(life))
}

// leaseOf returns the unused lease l holds for subject under rule (tag = subject).
func leaseOf(l *Limiter, rule Rule, subject string) int64 {
	e := l.leases.entry(key(l.opts.prefix, subject, rule.Name, "uwc", subject))
	e.sem <- struct{}{}
	defer func() { <-e.sem }()
	return e.lease
}

// One process with leases answers every request exactly as upstream's count would (allowed,
// remaining, excess, reset), reads (n = 0) included, while most requests never reach Redis; the
// Redis count is upstream's plus the process's unused lease.
func TestWindowLeasesOneProcessAnswersAsUpstream(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clk := &fakeClock{}
	clk.us.Store(leaseT0)
	l := newLeased(t, rdb, clk, 5*time.Second)
	rule := Rule{Name: "r", Algorithm: UpstreamWindow, Limit: 1000, Period: time.Hour}
	m := &upstreamModel{limit: rule.Limit}
	rng := rand.New(rand.NewPCG(1, 2))
	costs := []int64{0, 1, 1, 1, 1, 2, 3}
	const calls = 1200
	half := int64(-1) // Redis calls when the count first reached half the limit
	for i := range calls {
		if half < 0 && m.count >= rule.Limit/2 {
			half = l.Stats().Calls
			require.Less(t, half, int64(i/4), "leases served most calls locally while the key was far from its limit")
		}
		clk.add(time.Millisecond)
		n := costs[rng.IntN(len(costs))]
		ok, rem, exc := m.charge(n)
		got, err := l.DecideN(context.Background(), rule, "s", n)
		require.NoError(t, err, "call %d", i)
		require.Equal(t, ok, got.Allowed, "call %d (n=%d, count %d)", i, n, m.count)
		require.Equal(t, rem, got.Remaining, "call %d (n=%d, count %d)", i, n, m.count)
		require.Equal(t, exc, got.Excess, "call %d (n=%d, count %d)", i, n, m.count)
		if m.count > 0 {
			require.Equal(t, time.Hour-time.Duration(i+1)*time.Millisecond, got.ResetAfter, "call %d", i)
		}
	}
	require.Greater(t, m.count, rule.Limit, "the sequence goes over the limit")
	wkey := "t:v1:{s}:r:uwc:" + strconv.FormatInt(leaseT0, 10)
	c, err := rdb.Get(context.Background(), wkey).Int64()
	require.NoError(t, err)
	require.Equal(t, m.count, c-leaseOf(l, rule, "s"), "Redis holds upstream's count plus the unused lease")
	ttl, err := rdb.PTTL(context.Background(), wkey).Result()
	require.NoError(t, err)
	require.InDelta(t, float64(time.Hour+windowKeyMargin), float64(ttl), float64(time.Minute), "the key expires after its window")

	// The next window starts from 0, in a key of its own.
	clk.us.Store(leaseT0 + time.Hour.Microseconds() + 1000)
	got, err := l.DecideN(context.Background(), rule, "s", 1)
	require.NoError(t, err)
	require.True(t, got.Allowed)
	require.Equal(t, rule.Limit-1, got.Remaining)
}

// Without a lease life every call is one INCRBY (and one PEXPIRE per window and key), with
// upstream's answers.
func TestWindowLeasesOffCountsEveryCall(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clk := &fakeClock{}
	clk.us.Store(leaseT0 + 10*time.Minute.Microseconds())
	l := newLeased(t, rdb, clk, 0)
	rule := Rule{Name: "r", Algorithm: UpstreamWindow, Limit: 3, Period: time.Hour}
	srv.ResetStats(t)
	m := &upstreamModel{limit: rule.Limit}
	for i, n := range []int64{2, 0, 2, 0, 1} {
		clk.add(time.Millisecond)
		ok, rem, exc := m.charge(n)
		got, err := l.DecideN(context.Background(), rule, "s", n)
		require.NoError(t, err)
		want := Decision{Allowed: ok, Limit: 3, Remaining: rem, Excess: exc,
			ResetAfter: 50*time.Minute - time.Duration(i+1)*time.Millisecond}
		if !ok {
			want.RetryAfter = want.ResetAfter
		}
		require.Equal(t, want, got, "call %d", i)
	}
	st := srv.CommandStats(t)
	require.Equal(t, int64(3), st["incrby"], "one INCRBY per charge: %v", st)
	require.Equal(t, int64(2), st["get"], "one GET per read: %v", st)
	require.Equal(t, int64(1), st["pexpire"], "one PEXPIRE per window: %v", st)
	require.Zero(t, st["evalsha"]+st["eval"], "no script: %v", st)
}

// Two processes with leases on one Redis never admit more than the limit together, and refuse
// early by at most the leases they hold unused; each lease is at most 1/WindowLeaseShare of the
// limit.
func TestWindowLeasesTwoProcessesBound(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clk := &fakeClock{}
	clk.us.Store(leaseT0)
	a, b := newLeased(t, rdb, clk, 5*time.Second), newLeased(t, rdb, clk, 5*time.Second)
	rule := Rule{Name: "r", Algorithm: UpstreamWindow, Limit: 2000, Period: time.Hour}
	rng := rand.New(rand.NewPCG(3, 4))
	var admitted, charged int64
	maxLease := int64(0)
	for i := range 5000 {
		clk.add(100 * time.Microsecond)
		l := a
		if rng.IntN(3) == 0 {
			l = b
		}
		n := int64(1) // upstream then admits exactly the limit
		got, err := l.DecideN(context.Background(), rule, "s", n)
		require.NoError(t, err, "call %d", i)
		charged += n
		if got.Allowed {
			admitted += n
		}
		if admitted == rule.Limit/2 && got.Allowed {
			trips := a.Stats().Calls + b.Stats().Calls
			require.Less(t, trips, int64(i/4), "leases served most calls locally while the key was far from its limit")
		}
		maxLease = max(maxLease, leaseOf(a, rule, "s"), leaseOf(b, rule, "s"))
		require.LessOrEqual(t, admitted, rule.Limit, "call %d", i)
	}
	unused := leaseOf(a, rule, "s") + leaseOf(b, rule, "s")
	require.GreaterOrEqual(t, admitted, rule.Limit-unused, "refused early by at most the unused leases")
	require.LessOrEqual(t, maxLease, rule.Limit/WindowLeaseShare)
	require.Greater(t, maxLease, int64(1), "leases were taken")
	c, err := rdb.Get(context.Background(), "t:v1:{s}:r:uwc:"+strconv.FormatInt(leaseT0, 10)).Int64()
	require.NoError(t, err)
	require.Equal(t, charged+unused, c, "Redis holds every hit, refused ones included, and the unused leases")
}

// A lease that would take the count above the limit (another process counted meanwhile) is given
// back at once, and the answer is upstream's for the count without it.
func TestWindowLeaseCrossingTheLimitIsReturned(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clk := &fakeClock{}
	clk.us.Store(leaseT0)
	a, b := newLeased(t, rdb, clk, 5*time.Second), newLeased(t, rdb, clk, 5*time.Second)
	rule := Rule{Name: "r", Algorithm: UpstreamWindow, Limit: 1000, Period: time.Hour}
	ctx := context.Background()
	var count int64
	for leaseOf(a, rule, "s") == 0 { // demand builds until a takes a lease
		clk.add(time.Millisecond)
		_, err := a.AllowN(ctx, rule, "s", 1)
		require.NoError(t, err)
		count++
	}
	held := leaseOf(a, rule, "s")
	got, err := b.DecideN(ctx, rule, "s", rule.Limit-count-held-5) // b leaves 5 units
	require.NoError(t, err)
	require.Equal(t, int64(5), got.Remaining)
	for range held { // a uses its lease up
		_, err := a.AllowN(ctx, rule, "s", 1)
		require.NoError(t, err)
	}
	got, err = a.DecideN(ctx, rule, "s", 1) // a trip that asks for a lease the window no longer has
	require.NoError(t, err)
	require.Equal(t, Decision{Allowed: true, Limit: rule.Limit, Remaining: 4, ResetAfter: got.ResetAfter}, got)
	require.Zero(t, leaseOf(a, rule, "s"))
	c, err := rdb.Get(ctx, "t:v1:{s}:r:uwc:"+strconv.FormatInt(leaseT0, 10)).Int64()
	require.NoError(t, err)
	require.Equal(t, rule.Limit-4, c, "the lease went back")
}

// Under window leases, upstream_window rules cannot share a call with other algorithms.
func TestWindowLeasesRefuseMixedCalls(t *testing.T) {
	srv := redistest.Start(t)
	l := newLeased(t, srv.Client(t), &fakeClock{}, time.Second)
	_, err := l.AllowMulti(context.Background(), "s", []Check{
		{Rule: Rule{Name: "u", Algorithm: UpstreamWindow, Limit: 5, Period: time.Hour}, Subject: "s", N: 1},
		{Rule: Rule{Name: "f", Algorithm: FixedWindow, Limit: 5, Period: time.Hour}, Subject: "s", N: 1},
	})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = New(srv.Client(t), WithWindowLeases(-time.Second))
	require.ErrorIs(t, err, ErrInvalid)
}

// Processes serving one key from many goroutines at once (run it with -race) admit no more than
// the limit together, and refuse early by at most the leases they hold unused.
func TestWindowLeasesConcurrent(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.PoolSize = 32 })
	clk := &fakeClock{}
	clk.us.Store(leaseT0)
	ls := []*Limiter{newLeased(t, rdb, clk, 5*time.Second), newLeased(t, rdb, clk, 5*time.Second)}
	rule := Rule{Name: "r", Algorithm: UpstreamWindow, Limit: 3000, Period: time.Hour}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 250 {
				clk.add(50 * time.Microsecond)
				got, err := ls[g%2].DecideN(context.Background(), rule, "s", 1)
				if !assert.NoError(t, err) {
					return
				}
				if got.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	unused := leaseOf(ls[0], rule, "s") + leaseOf(ls[1], rule, "s")
	require.LessOrEqual(t, admitted.Load(), rule.Limit)
	require.GreaterOrEqual(t, admitted.Load(), rule.Limit-unused)
	c, err := rdb.Get(context.Background(), "t:v1:{s}:r:uwc:"+strconv.FormatInt(leaseT0, 10)).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(16*250)+unused, c, "every hit counted once, and the unused leases")
}

// A process whose lease state outgrows its bound gives the evicted keys' leases back to Redis, so
// that it still answers as upstream for every key (here, three keys through a bound of two).
func TestWindowLeasesEvictionGivesLeasesBack(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clk := &fakeClock{}
	clk.us.Store(leaseT0)
	l := newLeased(t, rdb, clk, 5*time.Second)
	l.leases = newWindowLeases(5*time.Second, 2)
	rule := Rule{Name: "r", Algorithm: UpstreamWindow, Limit: 500, Period: time.Hour}
	models := map[string]*upstreamModel{}
	subjects := []string{"a", "b", "c"}
	for i := range 900 {
		clk.add(time.Millisecond)
		s := subjects[(i/20)%3] // 20 requests on a key, then the next: every key is evicted in turn
		m := models[s]
		if m == nil {
			m = &upstreamModel{limit: rule.Limit}
			models[s] = m
		}
		ok, rem, exc := m.charge(1)
		got, err := l.DecideN(context.Background(), rule, s, 1)
		require.NoError(t, err, "call %d", i)
		require.Equal(t, [3]any{ok, rem, exc}, [3]any{got.Allowed, got.Remaining, got.Excess}, "call %d on %s", i, s)
	}
	for _, s := range subjects {
		base := "t:v1:{" + s + "}:r:uwc"
		c, err := rdb.Get(context.Background(), base+":"+strconv.FormatInt(leaseT0, 10)).Int64()
		require.NoError(t, err)
		var lease int64
		if e, ok := l.leases.entries.Peek(base); ok {
			lease = e.lease
		}
		require.Equal(t, models[s].count+lease, c, "Redis holds upstream's count of %s and the lease held", s)
	}
}
