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
	l := newTestStrict(t, rdb, WithClock(clk.now), WithWindowLeases(life))
	t.Cleanup(func() { _ = l.Close() }) // before the server stops: renewals in flight are sent
	if l.leases != nil {
		l.leases.every = 5 * time.Millisecond // the fake clock runs faster than the renewer's
	}
	return l
}

// leasedKeys starts a redis-server and a Limiter with window leases of life on a clock at leaseT0,
// and returns the entry names (bases) of n subjects "s0", "s1", … under rule.
func leasedKeys(t *testing.T, life time.Duration, rule Rule, n int) (*redis.Client, *Limiter, *fakeClock, []string) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clk := &fakeClock{}
	clk.us.Store(leaseT0)
	l := newLeased(t, rdb, clk, life)
	bases := make([]string, n)
	for i := range bases {
		bases[i] = key(l.opts.prefix, "s"+strconv.Itoa(i), rule.Name, "uwc", "s"+strconv.Itoa(i))
	}
	return rdb, l, clk, bases
}

// leaseOf returns the unused lease l holds for subject under rule (tag = subject), after the
// renewal in flight, if any, landed.
func leaseOf(l *Limiter, rule Rule, subject string) int64 {
	return settled(l, key(l.opts.prefix, subject, rule.Name, "uwc", subject)).lease
}

// settled returns a copy of the state of the entry named base, after its renewal in flight, if
// any, landed.
func settled(l *Limiter, base string) windowEntry {
	e := l.leases.entry(base)
	e.sem <- struct{}{}
	defer func() { <-e.sem }()
	e.settle(context.Background())
	return windowEntry{count: e.count, lease: e.lease, size: e.size}
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

// A key served in bursts (ten uses 100ms apart, then 2s of nothing) gets leases sized to its
// demand while active, not to its average over the wall clock: about twice as large, so about half
// the trips to Redis, and never more than its busy demand times the lease life. A key used as
// often on average at an even pace gets leases of its average demand.
func TestWindowLeasesSizedToDemandWhileActive(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const life = 10 * time.Second
	rule := Rule{Name: "r", Algorithm: UpstreamWindow, Limit: 1_000_000_000, Period: time.Hour}
	ctx := context.Background()
	// run makes the uses of each step (the pause before it) and returns the sizes of the leases
	// taken or topped up after the first minute and the Redis commands over the whole run.
	run := func(t *testing.T, steps []time.Duration) (leases []int64, trips int64) {
		clk := &fakeClock{}
		clk.us.Store(leaseT0)
		l := newLeased(t, rdb, clk, life)
		base := key(l.opts.prefix, t.Name(), rule.Name, "uwc", t.Name())
		var elapsed time.Duration
		for i, d := range steps {
			clk.add(d)
			elapsed += d
			_, err := l.leased(ctx, base, rule, 1)
			require.NoError(t, err, "use %d", i)
			// A renewal lands before the next use (the renewer sends it within 100 ms): the test
			// waits for it, so that the sizes do not depend on the machine's speed.
			if e := settled(l, base); elapsed > time.Minute && (len(leases) == 0 || e.size != leases[len(leases)-1]) {
				leases = append(leases, e.size)
			}
		}
		return leases, l.Stats().Calls
	}
	var bursts, even []time.Duration
	for range 60 { // 3 minutes
		for j := range 10 {
			d := 100 * time.Millisecond
			if j == 0 {
				d = 2100 * time.Millisecond
			}
			bursts = append(bursts, d)
			even = append(even, 300*time.Millisecond)
		}
	}
	t.Run("bursts", func(t *testing.T) {
		leases, trips := run(t, bursts)
		require.NotEmpty(t, leases)
		for _, k := range leases {
			// 10 units a second while busy (100 per lease life at most), 3.3 on the wall clock (33).
			// With pauses counted up to 4 of the lease's intervals, the estimate settles at 6.7 a
			// second: 67.
			assert.InDelta(t, 67, k, 8, "leases %v", leases)
			assert.LessOrEqual(t, k, int64(100), "at most the busy demand times the lease life")
		}
		assert.Less(t, trips, int64(20), "600 uses")
	})
	t.Run("an even pace", func(t *testing.T) {
		leases, trips := run(t, even)
		require.NotEmpty(t, leases)
		for _, k := range leases {
			assert.InDelta(t, 33, k, 3, "leases %v", leases)
		}
		assert.Greater(t, trips, int64(15), "600 uses")
	})
}

// Leases are renewed ahead of need, in the background, several keys' renewals in one pipeline: keys
// with a steady demand are served from their leases on every use after their first lease, and
// Redis counts every unit charged (the uses and the unused leases).
func TestWindowLeasesRenewedAhead(t *testing.T) {
	rule := Rule{Name: "r", Algorithm: UpstreamWindow, Limit: 1_000_000_000, Period: time.Hour}
	const keys = 50
	rdb, l, clk, bases := leasedKeys(t, 10*time.Second, rule, keys)
	ctx := context.Background()
	var pipelines atomic.Int64
	rdb.AddHook(pipelineCounter{&pipelines})
	var uses, hitsAfterFirstLease, usesAfterFirstLease int64
	for round := range 400 { // every key used every 100 ms: 10 a second, 40 s
		clk.add(100 * time.Millisecond)
		for _, b := range bases {
			before := l.Stats().LeaseHits
			_, err := l.leased(ctx, b, rule, 1)
			require.NoError(t, err, "round %d", round)
			uses++
			if round >= 5 {
				usesAfterFirstLease++
				hitsAfterFirstLease += l.Stats().LeaseHits - before
			}
		}
		for _, b := range bases {
			settled(l, b) // the renewals queued in this round land (the renewer sends within 5ms)
		}
	}
	assert.Equal(t, usesAfterFirstLease, hitsAfterFirstLease, "every use after the first lease served from a lease")
	var held int64
	for _, b := range bases {
		held += settled(l, b).lease
	}
	var counted int64
	for _, b := range bases {
		c, err := rdb.Get(ctx, b+":"+strconv.FormatInt(leaseT0, 10)).Int64()
		require.NoError(t, err)
		counted += c
	}
	assert.Equal(t, uses+held, counted, "Redis holds every use and the unused leases")
	renewals := l.Stats().Calls - 2*keys // each key's first two trips (no lease, then the first)
	assert.Greater(t, renewals, int64(keys), "leases were renewed")
	assert.Less(t, pipelines.Load(), renewals/4, "renewals shared pipelines (%d renewals)", renewals)
}

// pipelineCounter is a go-redis hook that counts pipelines.
type pipelineCounter struct{ n *atomic.Int64 }

func (pipelineCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// A key served from its lease takes the next window's lease shortly before its window ends, so that
// its first call of each window is served from a lease too, not from a trip to Redis; each window's
// count in Redis is still exactly what was used in it plus what its lease held unused at its end.
func TestWindowLeasesTakeTheNextWindowAhead(t *testing.T) {
	rule := Rule{Name: "r", Algorithm: UpstreamWindow, Limit: 1_000_000, Period: time.Second}
	const keys, windows = 20, 6
	rdb, l, clk, bases := leasedKeys(t, 2*time.Second, rule, keys)
	ctx := context.Background()
	// landed waits for every renewal of e in flight, this window's and the next's.
	landed := func(b string) windowEntry {
		e := l.leases.entry(b)
		e.sem <- struct{}{}
		defer func() { <-e.sem }()
		e.settle(context.Background())
		if r := e.next; r != nil {
			l.leases.mu.Lock()
			cancelled := r.cancelled
			l.leases.mu.Unlock()
			if !cancelled {
				<-r.done
			}
		}
		return windowEntry{count: e.count, lease: e.lease}
	}
	used := make(map[int64]int64)     // units used per window (by its start)
	leftover := make(map[int64]int64) // unused lease at the window's end, all keys
	var firstCalls, firstHits int64
	for w := range int64(windows) {
		start := leaseT0 + w*1_000_000
		for step := range 20 { // each key every 50 ms
			clk.us.Store(start + int64(step)*50_000)
			for _, b := range bases {
				before := l.Stats().LeaseHits
				d, err := l.leased(ctx, b, rule, 1)
				require.NoError(t, err)
				require.True(t, d.Allowed)
				used[start]++
				if step == 0 && w >= 2 {
					firstCalls++
					firstHits += l.Stats().LeaseHits - before
				}
			}
			for _, b := range bases {
				landed(b)
			}
		}
		for _, b := range bases {
			leftover[start] += landed(b).lease
		}
	}
	assert.Equal(t, firstCalls, firstHits, "from the third window on, each key's first call of a window is served from a lease")
	for w := range int64(windows) {
		start := leaseT0 + w*1_000_000
		var counted int64
		for _, b := range bases {
			c, err := rdb.Get(ctx, b+":"+strconv.FormatInt(start, 10)).Int64()
			require.NoError(t, err)
			counted += c
			ttl, err := rdb.PTTL(ctx, b+":"+strconv.FormatInt(start, 10)).Result()
			require.NoError(t, err)
			assert.Positive(t, ttl, "the window's key expires")
		}
		assert.Equal(t, used[start]+leftover[start], counted, "window %d: Redis holds what was used and the unused lease", w)
	}
	// The window after the last one holds only the leases taken ahead for it.
	var ahead int64
	for _, b := range bases {
		c, err := rdb.Get(ctx, b+":"+strconv.FormatInt(leaseT0+windows*1_000_000, 10)).Int64()
		require.NoError(t, err)
		ahead += c
	}
	assert.Positive(t, ahead, "the next window's leases were taken ahead")
	assert.LessOrEqual(t, ahead, int64(keys)*rule.Limit/WindowLeaseShare)
}
