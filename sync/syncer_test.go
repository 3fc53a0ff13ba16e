package sync

import (
	"context"
	"errors"
	"math"
	"strconv"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/local"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeCentral is an in-memory port with the script's lease semantics, without refill: consumption
// beyond the charge is debt; a call with Want or N tops the node's unused lease up from the bucket.
type fakeCentral struct {
	mu      stdsync.Mutex
	tokens  map[string]int64 // micro-tokens
	charged map[string]int64
	cum     map[string]int64
	calls   int
	fail    error         // when not nil, every key fails with it
	block   chan struct{} // when not nil, Reconcile waits on it
	delay   time.Duration // Reconcile takes this long
	sent    [][]central.Update
}

func newFake() *fakeCentral {
	return &fakeCentral{tokens: map[string]int64{}, charged: map[string]int64{}, cum: map[string]int64{}}
}

func (f *fakeCentral) Reconcile(ctx context.Context, ups []central.Update, out []central.State, errs []error) error {
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	time.Sleep(f.delay)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.sent = append(f.sent, append([]central.Update(nil), ups...))
	if f.fail != nil {
		for i := range errs {
			errs[i] = f.fail
		}
		return f.fail
	}
	for i, u := range ups {
		if _, ok := f.tokens[u.Key]; !ok {
			f.tokens[u.Key] = u.Limit.Burst * 1_000_000
		}
		f.cum[u.Key] = max(f.cum[u.Key], u.Cum)
		if d := f.cum[u.Key] - f.charged[u.Key]; d > 0 {
			f.tokens[u.Key] -= d * 1_000_000
			f.charged[u.Key] = f.cum[u.Key]
		}
		status := central.StatusDone
		if have, target := f.charged[u.Key]-f.cum[u.Key], max(u.Want, u.N); target > have {
			g := min(target-have, max(f.tokens[u.Key]/1_000_000, 0))
			if u.N > 0 && have+g < u.N {
				g, status = 0, central.StatusDenied
			} else if u.N > 0 {
				status = central.StatusCovered
			}
			f.tokens[u.Key] -= g * 1_000_000
			f.charged[u.Key] += g
		} else if u.N > 0 {
			status = central.StatusCovered
		}
		out[i] = central.State{Status: status, Charged: f.charged[u.Key], Tokens: f.tokens[u.Key], Demand: u.Demand}
	}
	return nil
}

func (f *fakeCentral) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *fakeCentral) last() []central.Update {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sent) == 0 {
		return nil
	}
	return f.sent[len(f.sent)-1]
}

// clock is a settable monotonic clock.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() int64          { return c.ns.Load() }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }
func newClock() *clock               { c := &clock{}; c.ns.Store(int64(time.Hour)); return c }
func mono() int64                    { return time.Now().UnixNano() }

var lim = central.Limit{Rate: 50, Burst: 100}

func setup(t *testing.T, f *fakeCentral, now func() int64) (*local.Store, *Syncer) {
	t.Helper()
	st, err := local.New(local.Config{MaxKeys: 1024})
	require.NoError(t, err)
	s, err := New(Config{Store: st, Central: f, Interval: 20 * time.Millisecond, MaxBatch: 3, Drift: 0.5,
		Horizon: time.Second, LeaseLife: 2 * time.Second, Now: now})
	require.NoError(t, err)
	return st, s
}

// setupKey sets up a syncer on a fake central and a fake clock, and inserts key with a cold-start
// credit of credit tokens.
func setupKey(t *testing.T, key string, credit int64) (*fakeCentral, *clock, *Syncer, *local.Entry) {
	t.Helper()
	f, c := newFake(), newClock()
	st, s := setup(t, f, c.now)
	return f, c, s, entry(t, st, key, credit)
}

// entry inserts key with a cold-start credit of credit tokens.
func entry(t *testing.T, st *local.Store, key string, credit int64) *local.Entry {
	t.Helper()
	e := st.Insert(key, st.Hash(key), lim.Rate, lim.Burst, credit)
	require.NotNil(t, e)
	return e
}

func TestNewValidates(t *testing.T) {
	st, _ := local.New(local.Config{MaxKeys: 64})
	ok := Config{Store: st, Central: newFake(), Interval: time.Second, MaxBatch: 1, Drift: 0.5, Horizon: time.Second,
		LeaseLife: time.Second, Now: mono}
	_, err := New(ok)
	require.NoError(t, err)
	for _, bad := range []func(*Config){
		func(c *Config) { c.Store = nil },
		func(c *Config) { c.Interval = 0 },
		func(c *Config) { c.MaxBatch = 0 },
		func(c *Config) { c.Drift = 1.5 },
		func(c *Config) { c.Horizon = 0 },
		func(c *Config) { c.LeaseLife = 0 },
		func(c *Config) { c.Now = nil },
	} {
		cfg := ok
		bad(&cfg)
		_, err := New(cfg)
		assert.Error(t, err, "%+v", cfg)
	}
}

// seeNew runs the round that first sees new keys: it sends nothing for keys never answered.
func seeNew(t *testing.T, s *Syncer) {
	t.Helper()
	require.NoError(t, s.flush(context.Background(), due))
}

func TestColdStartDebtIsReportedAndALeaseGranted(t *testing.T) {
	f := newFake()
	c := newClock()
	st, s := setup(t, f, c.now)
	var es []*local.Entry
	for i := range 7 { // three batches of at most 3
		e := entry(t, st, "k"+strconv.Itoa(i), 10)
		for range i + 1 {
			require.Equal(t, local.Taken, e.TryTake(1))
		}
		es = append(es, e)
	}
	c.add(time.Second)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, 3, f.n(), "a cold-start credit of 10: sent at once")
	for i, e := range es {
		used := int64(i + 1)
		assert.False(t, e.Pending(), i)
		assert.Equal(t, used, f.cum["k"+strconv.Itoa(i)], "the cold-start consumption is charged once")
		assert.Greater(t, e.Charged(), used, "a lease on top of it")
		assert.Greater(t, e.Mark(), e.Charged(), "and a credit")
	}
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, 3, f.n(), "leases far from spent: nothing sent")
}

func TestLeaseIsRenewedBeforeItRunsOut(t *testing.T) {
	f, c, s, e := setupKey(t, "k", 1)
	require.Equal(t, local.Taken, e.TryTake(1))
	c.add(time.Second)
	seeNew(t, s)
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	lease := e.Unused()
	require.Positive(t, lease)
	// Spend the lease down to its low-water mark at a steady demand: the next flush renews it.
	for e.Unused() > s.lowWater(e.Demand()) {
		require.Equal(t, local.Taken, e.TryTake(1))
	}
	n := f.n()
	c.add(100 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	// At this demand (about 1/s) the key is rare: its renewal is not urgent and waits up to
	// coalesce intervals after the last round for other keys to join it.
	assert.Equal(t, n, f.n(), "a rare key's renewal waits for the round to fill")
	c.add(coalesce * 20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n+1, f.n())
	assert.Positive(t, f.last()[0].Want, "the call asks for a lease")
	assert.Greater(t, e.Unused(), s.lowWater(e.Demand()))
}

func TestFailedFlushKeepsConsumption(t *testing.T) {
	f, _, s, e := setupKey(t, "k", 5)
	for range 4 {
		require.Equal(t, local.Taken, e.TryTake(1))
	}
	f.fail = central.ErrUnavailable
	require.Error(t, s.Flush(context.Background()))
	assert.True(t, e.Pending(), "the debt stays pending")
	require.Equal(t, local.Taken, e.TryTake(1))
	f.fail = nil
	require.NoError(t, s.Flush(context.Background()))
	assert.Equal(t, int64(5), f.charged["k"], "all consumption charged once")
	assert.Equal(t, int64(95_000_000), f.tokens["k"])
	assert.Equal(t, int64(1), s.Stats().FailedKeys.Load())
}

func TestBadKeyWaitsAndOthersProceed(t *testing.T) {
	f, c, s, e := setupKey(t, "k", 5)
	require.Equal(t, local.Taken, e.TryTake(1))
	f.fail = central.ErrBadKey
	require.Error(t, s.flush(context.Background(), due))
	f.fail = nil
	n := f.n()
	c.add(100 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n, f.n(), "a refused key pauses")
	c.add(time.Second)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n+1, f.n(), "then is sent again")
	assert.False(t, e.Pending())
	assert.Equal(t, int64(1), s.Stats().BadKeys.Load())
}

func TestExpiredLeaseIsWrittenOffWithoutRedis(t *testing.T) {
	f, c, s, e := setupKey(t, "k", 1)
	require.Equal(t, local.Taken, e.TryTake(1))
	seeNew(t, s)
	require.NoError(t, s.flush(context.Background(), due))
	unused := e.Unused()
	require.Positive(t, unused)
	n := f.n()
	c.add(3 * time.Second) // past LeaseLife
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n, f.n(), "no call")
	assert.Equal(t, int64(0), e.Unused())
	assert.Equal(t, unused, s.Stats().Burned.Load())
	assert.Equal(t, int64(0), s.Stats().Waiting.Load(), "nothing left to watch")
}

func TestReleaseReportsWhatRedisHasNotCounted(t *testing.T) {
	f, c, s, e := setupKey(t, "k", 1)
	require.Equal(t, local.Taken, e.TryTake(1))
	c.add(20 * time.Millisecond) // a new key reports one round after it was first seen
	require.NoError(t, s.flush(context.Background(), due))
	require.NoError(t, s.flush(context.Background(), due))
	require.Positive(t, e.Unused())
	n := f.n()
	require.NoError(t, s.Release(context.Background()))
	assert.Equal(t, n, f.n(), "a key that holds only a lease costs no call")
	assert.Zero(t, e.Unused(), "the lease is written off")
	require.Equal(t, local.Taken, e.TryTake(1), "credit above the written-off lease")
	require.NoError(t, s.Release(context.Background()))
	assert.Equal(t, n+1, f.n(), "uncounted consumption is reported")
	assert.False(t, e.Pending())
	assert.False(t, e.Unreported())
}

func TestRunIdleNeverFlushes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		st, s := setup(t, f, mono)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, 0, f.n(), "an idle store never flushes")
		e := entry(t, st, "k", 1)
		require.Equal(t, local.Taken, e.TryTake(1))
		time.Sleep(39 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 0, f.n(), "the round that first sees the key waits for a second request")
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 1, f.n(), "the cold-start debt is reported two intervals later")
		assert.False(t, e.Pending())
		cancel()
		<-done
	})
}

func TestOnErrorAndOnState(t *testing.T) {
	f := newFake()
	st, _ := setup(t, f, mono)
	var states int
	s, err := New(Config{Store: st, Central: f, Interval: time.Millisecond, MaxBatch: 10, Drift: 0.1, Now: mono,
		Horizon: time.Second, LeaseLife: time.Second,
		OnState: func(*local.Entry, central.State) { states++ }})
	require.NoError(t, err)
	e := entry(t, st, "k", 2)
	require.Equal(t, local.Taken, e.TryTake(1))
	require.NoError(t, s.Flush(context.Background()))
	assert.Equal(t, 1, states)
	f.fail = central.ErrUnavailable
	require.Equal(t, local.Taken, e.TryTake(1))
	assert.True(t, errors.Is(s.Flush(context.Background()), central.ErrUnavailable))
}

// TestIdleKeyReportsItsUse: tokens admitted from a lease are charged in Redis but not yet counted;
// a key that then goes idle reports them once its lease is spent or written off, so that it becomes
// evictable: churn must not fill the store with keys waiting for Close.
func TestIdleKeyReportsItsUse(t *testing.T) {
	f, c, s, e := setupKey(t, "k", 1)
	require.Equal(t, local.Taken, e.TryTake(1))
	seeNew(t, s)
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	require.Positive(t, e.Unused())
	require.Equal(t, local.Taken, e.TryTake(1), "from the lease")
	require.True(t, e.Unreported())
	for range 4 { // 4 s: idle, and past LeaseLife
		c.add(time.Second)
		require.NoError(t, s.flush(context.Background(), due))
	}
	assert.Equal(t, int64(2), f.last()[0].Used, "both admitted tokens counted")
	assert.False(t, e.Unreported())
	assert.Zero(t, s.Stats().Waiting.Load(), "nothing left to watch")
	n := f.n()
	c.add(time.Second)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n, f.n(), "and nothing more")
}

// TestNewSparseKeyWaitsARoundForASecondRequest: a new key with the minimum cold-start credit (two
// tokens) is reported from the round after the one that first saw it, so a second request that
// follows the first at once shares the call: one call per new client, not two.
func TestNewSparseKeyWaitsARoundForASecondRequest(t *testing.T) {
	f := newFake()
	c := newClock()
	st, s := setup(t, f, c.now)
	e := entry(t, st, "k", 2)
	require.Equal(t, local.Taken, e.TryTake(1))
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, 0, f.n(), "the round that first sees it sends nothing")
	require.Equal(t, local.Taken, e.TryTake(1), "a second request at once")
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, 1, f.n())
	assert.Equal(t, int64(2), f.cum["k"], "both requests in one call")
	hot := entry(t, st, "hot", 25)
	require.Equal(t, local.Taken, hot.TryTake(1))
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, 2, f.n(), "a larger cold-start credit (a hot key) is reported at once")
}

func TestShutdownMidRoundIsNoFailure(t *testing.T) {
	f := newFake()
	st, s := setup(t, f, mono)
	e := entry(t, st, "k", 2)
	require.Equal(t, local.Taken, e.TryTake(1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.fail = ctx.Err() // the client reports every key of a round cut short by shutdown so
	require.ErrorIs(t, s.Flush(ctx), context.Canceled)
	assert.Zero(t, s.Stats().FailedKeys.Load(), "a round cut short by shutdown is no failure")
	assert.True(t, e.Pending(), "the key stays pending for the final flush")
	f.fail = errors.New("connection reset")
	require.Error(t, s.Flush(context.Background()))
	assert.Equal(t, int64(1), s.Stats().FailedKeys.Load(), "a real failure counts")
	f.fail = nil
	require.NoError(t, s.Flush(context.Background()))
	assert.False(t, e.Pending())
}

// TestRareKeyReportWaitsForTheRound: a key this node sees about once in twenty seconds (a minority
// node of a sticky key) is not urgent when its allowance is spent: its report waits for the next
// round, up to coalesce intervals, rather than forcing a round of its own; a busy key's is sent at
// once.
func TestRareKeyReportWaitsForTheRound(t *testing.T) {
	f := newFake()
	c := newClock()
	st, s := setup(t, f, c.now)
	e := entry(t, st, "rare", 2)
	for range 4 { // a request every 20 s, each reported
		require.Equal(t, local.Taken, e.TryTake(1))
		c.add(20 * time.Millisecond)
		require.NoError(t, s.flush(context.Background(), due))
		c.add(coalesce * 20 * time.Millisecond)
		require.NoError(t, s.flush(context.Background(), due))
		c.add(20 * time.Second)
	}
	require.Less(t, e.Demand(), 1/rareNeed.Seconds(), "a rare key")
	busy := entry(t, st, "busy", 50)
	for range 50 {
		require.Equal(t, local.Taken, busy.TryTake(1))
	}
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due)) // a round: the busy key's first report
	require.Greater(t, busy.Demand(), 1/rareNeed.Seconds(), "a busy key")

	for e.TryTake(1) == local.Taken { // the rare key's lease and credit spent
	}
	n := f.n()
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n, f.n(), "the rare key's report waits for the round to fill")
	c.add(coalesce * 20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n+1, f.n(), "and goes with the next round")
	assert.Equal(t, "rare", f.last()[0].Key)

	for busy.TryTake(1) == local.Taken { // the busy key's allowance spent, right after a round
	}
	n = f.n()
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n+1, f.n(), "a busy key with its allowance spent is sent at once")
}

// A key of a few requests a second whose lease is spent waits for the round to fill while its
// credit lasts, and goes at once when the credit is spent too. (Before, a spent lease alone made
// the round go at once: on sparse keys, nearly every round was such a key's.)
func TestSparseKeyWaitsWhileItsCreditLasts(t *testing.T) {
	f, c, s, e := setupKey(t, "k", 2)
	for range 40 { // 4 requests a second for 10 s, each reported
		e.TryTake(1)
		c.add(250 * time.Millisecond)
		require.NoError(t, s.flush(context.Background(), due))
	}
	d := e.Demand()
	require.Greater(t, d, 2.0)
	require.Zero(t, s.urgentWater(d), "a key under a token per two intervals")

	// A round that leaves the bucket a few tokens, so the answer's credit is a few tokens.
	f.mu.Lock()
	f.tokens["k"] = 10_000_000
	f.mu.Unlock()
	for e.Unused() > s.lowWater(e.Demand()) { // down to the renewal's low water
		require.Equal(t, local.Taken, e.TryTake(1))
	}
	c.add(coalesceBusy * 20 * time.Millisecond) // the round goes, urgent or not
	n := f.n()
	require.NoError(t, s.flush(context.Background(), due))
	require.Equal(t, n+1, f.n())
	require.Positive(t, e.Unused())
	require.Greater(t, e.Mark(), e.Charged(), "the answer gave credit")
	require.Less(t, float64(e.Mark()-e.Total()+1), d*rareNeed.Seconds(), "not a rare key")

	for e.Unused() > 0 { // the lease spent: the credit is left
		require.Equal(t, local.Taken, e.TryTake(1))
	}
	n = f.n()
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n, f.n(), "the renewal waits for the round to fill while the credit lasts")

	for e.TryTake(1) == local.Taken { // the credit spent too
	}
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n+1, f.n(), "a key with nothing left is sent at once")
	assert.Equal(t, "k", f.last()[0].Key)
}

// A sparse key (about a request a second) whose lease and credit are spent right after a round
// waits for the next round while it expects fewer than soonRisk requests (two intervals at 1/s),
// instead of making its node's round go at once. (Before, on loadgen's sparse scenario, such keys
// made nearly every interval a round on every node.)
func TestSpentSparseKeyWaitsBriefly(t *testing.T) {
	f, c, s, e := setupKey(t, "k", 2)
	for range 40 { // a request a second for 40 s, each reported by the round that follows
		require.Equal(t, local.Taken, e.TryTake(1))
		c.add(time.Second)
		require.NoError(t, s.flush(context.Background(), due))
	}
	d := e.Demand()
	require.InDelta(t, 1.0, d, 0.3)
	require.Zero(t, s.urgentWater(d), "a sparse key")
	wait := s.soonWait(d)
	require.Equal(t, int64(soonRisk/(d*0.02)), wait, "0.05 requests at 1/s take 50 ms: two intervals")
	require.Greater(t, wait, int64(1))

	for e.TryTake(1) == local.Taken { // lease and credit spent, right after a round
	}
	require.True(t, e.Pending(), "debt")
	n := f.n()
	for i := int64(1); i < wait; i++ {
		c.add(20 * time.Millisecond)
		require.NoError(t, s.flush(context.Background(), due))
		require.Equal(t, n, f.n(), "interval %d: the renewal waits for the round", i)
	}
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n+1, f.n(), "and goes after %d intervals", wait)
	assert.Equal(t, "k", f.last()[0].Key)
	assert.Equal(t, int64(coalesce), s.soonWait(0.01), "at most coalesce intervals")
	assert.Equal(t, int64(1), s.soonWait(100), "at least one")
}

// A key whose demand estimate is still that of a busy past, but that asked once in the 30 s since
// its last call, is judged by that recent rate: its report waits for the round like a rare key's.
// (On loadgen's sticky scenario, minority nodes rated their keys at 1–2/s from their first second
// and, once their leases had expired, sent a round at once for each request: 172 rounds/s.)
func TestQuietKeyIsJudgedByItsRecentRate(t *testing.T) {
	f := newFake()
	c := newClock()
	st, s := setup(t, f, c.now)
	e := entry(t, st, "q", 2)
	for i := range 20 { // two requests a second for 10 s
		if i == 19 {
			f.mu.Lock()
			f.tokens["q"] = 3_000_000 // a nearly empty bucket: the last answer's credit is one token
			f.mu.Unlock()
		}
		require.Equal(t, local.Taken, e.TryTake(1))
		c.add(500 * time.Millisecond)
		require.NoError(t, s.flush(context.Background(), due))
	}
	d := e.Demand()
	require.Greater(t, d, 1.0)
	require.LessOrEqual(t, e.Mark()-e.Charged(), int64(1), "credit")

	c.add(30 * time.Second) // quiet: the lease expires, nothing is sent
	n := f.n()
	require.NoError(t, s.flush(context.Background(), due))
	require.Equal(t, n, f.n())
	busy := entry(t, st, "busy", 50)
	for range 50 {
		require.Equal(t, local.Taken, busy.TryTake(1))
	}
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due)) // a round: the busy key's first report
	require.Equal(t, n+1, f.n())

	for e.TryTake(1) == local.Taken { // one request spends what is left
	}
	require.True(t, e.Pending(), "debt")
	require.Equal(t, d, e.Demand(), "no call since: the estimate is the busy past's")
	require.Less(t, e.RecentRate(c.now()), 1/rareNeed.Seconds())
	n = f.n()
	for i := 1; i < coalesce; i++ {
		c.add(20 * time.Millisecond)
		require.NoError(t, s.flush(context.Background(), due))
		require.Equal(t, n, f.n(), "interval %d: the report waits for the round", i)
	}
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	assert.Equal(t, n+1, f.n(), "and goes with the next round")
	assert.Equal(t, "q", f.last()[0].Key)
}

// busySetup returns a fake Redis, a clock, a store and a syncer with the library's lease horizon
// and life, for tests of busy keys' rounds. A small drift keeps the overdraft credit small: with a
// large one, a key would count as rare (its allowance lasts seconds), and rare keys neither join
// rounds early nor wait for their urgent mark.
func busySetup(t *testing.T) (*fakeCentral, *clock, *local.Store, *Syncer) {
	t.Helper()
	f := newFake()
	c := newClock()
	st, err := local.New(local.Config{MaxKeys: 1024})
	require.NoError(t, err)
	s, err := New(Config{Store: st, Central: f, Interval: 20 * time.Millisecond, MaxBatch: 10, Drift: 0.01,
		Horizon: 4 * time.Second, LeaseLife: 8 * time.Second, Now: c.now})
	require.NoError(t, err)
	return f, c, st, s
}

// TestBusyKeysJoinARoundThatGoes: when a key's renewal sends a round, the node's other busy keys
// whose lease would be due within about one more round's wait (topUpWater) join it; a key with
// more left does not.
func TestBusyKeysJoinARoundThatGoes(t *testing.T) {
	f, c, st, s := busySetup(t)
	keys := map[string]*local.Entry{}
	for _, k := range []string{"due", "soon", "later"} {
		keys[k] = st.Insert(k, st.Hash(k), 1000, 2000, 1)
		require.NotNil(t, keys[k])
	}
	// Two seconds at 50 requests a second on every key, a round whenever one is due.
	for range 100 {
		for _, e := range keys {
			if e.TryTake(1) != local.Taken {
				e.Deny(1)
			}
		}
		c.add(20 * time.Millisecond)
		require.NoError(t, s.flush(context.Background(), due))
	}
	// Spend every lease down to where its renewal must go (renewBy): one round renews all three.
	for _, e := range keys {
		for e.Unused() > goMark(s, e.Demand()) {
			require.Equal(t, local.Taken, e.TryTake(1))
		}
	}
	c.add(coalesceBusy * 20 * time.Millisecond)
	n := f.n()
	require.NoError(t, s.flush(context.Background(), due))
	require.Equal(t, n+1, f.n())
	require.Len(t, f.last(), 3)
	// Then spend each key down to where the test wants it, by its own demand.
	for k, e := range keys {
		low, top := s.lowWater(e.Demand()), s.topUpWater(e.Demand())
		require.Greater(t, low, int64(5), "a busy key: demand %v", e.Demand())
		left := map[string]int64{"due": goMark(s, e.Demand()), "soon": (low + top) / 2, "later": top + low/2}[k]
		require.Greater(t, e.Unused(), left, k)
		for e.Unused() > left {
			require.Equal(t, local.Taken, e.TryTake(1))
		}
	}
	c.add(coalesceBusy * 20 * time.Millisecond)
	n = f.n()
	require.NoError(t, s.flush(context.Background(), due))
	require.Equal(t, n+1, f.n(), "the due key's renewal sends a round")
	var sent []string
	for _, u := range f.last() {
		sent = append(sent, u.Key)
	}
	assert.ElementsMatch(t, []string{"due", "soon"}, sent, "the key due soon joins; the one with more left waits")
}

// goMark returns the unused lease at which a busy key's renewal goes (renewBy): renewMargin
// intervals of demand above its urgent mark.
func goMark(s *Syncer, d float64) int64 {
	return s.urgentWater(d) + int64(math.Floor(d*renewMargin*s.cfg.Interval.Seconds()))
}

// TestBusyRenewalGoesNearItsUrgentMark: a busy key down to its renewal mark (lowWater) does not
// send a round on its own while its lease lasts more than renewMargin intervals beyond its urgent
// mark, even when the node's last round is long past; it sends one once it is down to that point,
// topping up more than a renewal at lowWater would. A key that turns urgent sends one at once.
func TestBusyRenewalGoesNearItsUrgentMark(t *testing.T) {
	f, c, st, s := busySetup(t)
	e := st.Insert("k", st.Hash("k"), 1000, 2000, 1)
	require.NotNil(t, e)
	for range 100 { // two seconds at 50 requests a second
		if e.TryTake(1) != local.Taken {
			e.Deny(1)
		}
		c.add(20 * time.Millisecond)
		require.NoError(t, s.flush(context.Background(), due))
	}
	d := e.Demand()
	low, mark := s.lowWater(d), goMark(s, d)
	require.Greater(t, low, mark+5, "a busy key: demand %v", d)
	for e.Unused() > low {
		require.Equal(t, local.Taken, e.TryTake(1))
	}
	c.add(coalesceBusy * 20 * time.Millisecond)
	n := f.n()
	require.NoError(t, s.flush(context.Background(), due))
	require.Equal(t, n, f.n(), "at lowWater, with its lease lasting a while, the renewal waits")
	for e.Unused() > mark+1 {
		require.Equal(t, local.Taken, e.TryTake(1))
	}
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	require.Equal(t, n, f.n(), "one token above the point, it still waits")
	require.Equal(t, local.Taken, e.TryTake(1))
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	require.Equal(t, n+1, f.n(), "down to the point, it goes")
	require.Len(t, f.last(), 1)

	// A key that turns urgent goes at once, whatever the time since the last round.
	for e.Unused() > s.urgentWater(e.Demand()) {
		require.Equal(t, local.Taken, e.TryTake(1))
	}
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	require.Equal(t, n+2, f.n(), "an urgent key does not wait")

	// A slow round makes renewals go earlier, by twice its duration.
	require.Less(t, s.slow, int64(50*time.Millisecond))
	f.delay = 50 * time.Millisecond
	for e.Unused() > s.urgentWater(e.Demand()) {
		require.Equal(t, local.Taken, e.TryTake(1))
	}
	c.add(20 * time.Millisecond)
	require.NoError(t, s.flush(context.Background(), due))
	require.Equal(t, n+3, f.n())
	require.GreaterOrEqual(t, s.slow, int64(50*time.Millisecond), "the round's duration is kept")
	now, u, slow := c.now(), goMark(s, d)+int64(d), s.slow
	s.slow = 0
	fast := s.renewBy(now, u, d)
	s.slow = slow
	require.Greater(t, fast, now+int64(900*time.Millisecond), "a second of demand above the point")
	require.InDelta(t, fast-2*slow, s.renewBy(now, u, d), 1e3, "earlier by twice the slow round, to a microsecond")
}

// TestCreditAddsUpToOneLendableAmount (issue 21): the overdraft credit of each of A nodes is at most
// budget/A, so A nodes' credits never add up to more than the budget, however many they are.
func TestCreditAddsUpToOneLendableAmount(t *testing.T) {
	for _, c := range []struct {
		drift                  float64
		tokens, budget, active int64
		want                   int64
	}{
		{0.1, 100e6, 110, 1, 10},  // drift·G/A
		{0.1, 5e6, 110, 8, 1},     // the floor of one token
		{0.1, 100e6, 110, 64, 1},  // budget/A = 1
		{0.1, 100e6, 110, 512, 0}, // budget/A under a token: none
		{0.1, 100e6, 60, 4096, 0}, // a large fleet
		{0.1, 0.5e6, 110, 1, 0},   // an empty bucket
		{0, 100e6, 110, 1, 0},     // strict mode
	} {
		if got := Credit(c.drift, c.tokens, c.budget, c.active); got != c.want {
			t.Errorf("Credit(%v, %d, %d, %d) = %d, want %d", c.drift, c.tokens, c.budget, c.active, got, c.want)
		}
		if got := Credit(c.drift, c.tokens, c.budget, c.active); got*c.active > c.budget {
			t.Errorf("Credit(%v, %d, %d, %d) = %d: %d nodes would hold more than the budget", c.drift, c.tokens, c.budget, c.active, got, c.active)
		}
	}
}

// TestThinKeyAsksForNoLease (issue 21): a key whose last synchronous answer left this node nothing
// beyond its request (hybrid marks it thin on a fleet larger than the key's burst) is not sent for
// a renewal Redis would not grant; the same key, not thin, is.
func TestThinKeyAsksForNoLease(t *testing.T) {
	f := newFake()
	c := newClock()
	st, s := setup(t, f, c.now)
	// A synchronous take of one token, counted by Redis, that left nothing beyond it.
	e := entry(t, st, "k", 0)
	cl := e.Next(c.now())
	e.Grant(local.Answer{Seq: cl.Seq, Charged: 1, SentUsed: 1, At: c.now(), LeaseUntil: c.now() + int64(2*time.Second)})
	require.Equal(t, local.Taken, e.TryTake(1))
	require.False(t, e.Pending())
	require.False(t, e.Unreported())
	e.SetThin(true)
	seeNew(t, s)
	for range 30 {
		c.add(20 * time.Millisecond)
		require.NoError(t, s.flush(context.Background(), due))
	}
	assert.Zero(t, f.n(), "a thin key with nothing to report costs no call")
	e.SetThin(false)
	for range 30 {
		c.add(20 * time.Millisecond)
		require.NoError(t, s.flush(context.Background(), due))
	}
	assert.Positive(t, f.n(), "the same key, not thin, asks for a lease")
}
