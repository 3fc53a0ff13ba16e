package sync

import (
	"context"
	"errors"
	"strconv"
	stdsync "sync"
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

// fakeCentral is an in-memory port: a global bucket per key without refill, applying cumulative
// consumption exactly like the script (cum - applied when positive).
type fakeCentral struct {
	mu      stdsync.Mutex
	tokens  map[string]int64 // micro-tokens
	applied map[string]int64
	calls   int
	fail    bool
	block   chan struct{} // when not nil, Reconcile waits on it
	sent    [][]central.Update
}

func newFake() *fakeCentral {
	return &fakeCentral{tokens: map[string]int64{}, applied: map[string]int64{}}
}

func (f *fakeCentral) Reconcile(ctx context.Context, ups []central.Update, out []central.State, errs []error) error {
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.sent = append(f.sent, append([]central.Update(nil), ups...))
	if f.fail {
		for i := range errs {
			errs[i] = central.ErrUnavailable
		}
		return central.ErrUnavailable
	}
	for i, u := range ups {
		if _, ok := f.tokens[u.Key]; !ok {
			f.tokens[u.Key] = u.Limit.Burst * 1_000_000
		}
		if d := u.Cum - f.applied[u.Key]; d > 0 {
			f.tokens[u.Key] -= d * 1_000_000
			f.applied[u.Key] = u.Cum
		}
		out[i] = central.State{Taken: -1, Applied: f.applied[u.Key], Tokens: f.tokens[u.Key], Active: 1}
	}
	return nil
}

func (f *fakeCentral) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func mono() int64 { return time.Now().UnixNano() }

func setup(t *testing.T, f *fakeCentral) (*local.Store, *Syncer) {
	t.Helper()
	st, err := local.New(local.Config{MaxKeys: 1024})
	require.NoError(t, err)
	s, err := New(Config{Store: st, Central: f, Interval: 20 * time.Millisecond, MaxBatch: 3, Drift: 0.5, Now: mono, Round: func() float64 { return 0 }})
	require.NoError(t, err)
	return st, s
}

func entry(t *testing.T, st *local.Store, key string) *local.Entry {
	t.Helper()
	e := st.Insert(key, st.Hash(key))
	require.NotNil(t, e)
	e.SetLimit(50, 100)
	e.Grant(0, 10, 100_000_000, 1, 0, 1)
	return e
}

func TestNewValidates(t *testing.T) {
	st, _ := local.New(local.Config{MaxKeys: 64})
	for _, cfg := range []Config{
		{},
		{Store: st, Central: newFake(), Interval: 0, MaxBatch: 1},
		{Store: st, Central: newFake(), Interval: time.Second, MaxBatch: 0},
		{Store: st, Central: newFake(), Interval: time.Second, MaxBatch: 1, Drift: 1.5, Now: mono},
		{Store: st, Central: newFake(), Interval: time.Second, MaxBatch: 1, Drift: 0.5},
	} {
		_, err := New(cfg)
		assert.Error(t, err, "%+v", cfg)
	}
}

func TestFlushAppliesAndGrants(t *testing.T) {
	f := newFake()
	st, s := setup(t, f)
	var es []*local.Entry
	for i := range 7 { // three batches of at most 3
		e := entry(t, st, "k"+strconv.Itoa(i))
		for range i + 1 {
			require.Equal(t, local.Taken, e.TryTake(1))
		}
		es = append(es, e)
	}
	require.NoError(t, s.Flush(context.Background()))
	assert.Equal(t, 3, f.n())
	for i, e := range es {
		used := int64(i + 1)
		assert.Equal(t, used, e.Acked(), i)
		// allowance = floor(0.5·(100 - used) + 50·0.02)
		want := used + int64(0.5*float64(100-used)+1)
		assert.Equal(t, want, e.Mark(), i)
	}
	assert.Equal(t, int64(0), st.Dirty())
	require.NoError(t, s.Flush(context.Background()))
	assert.Equal(t, 3, f.n(), "nothing dirty, nothing sent")
}

func TestFailedFlushKeepsConsumption(t *testing.T) {
	f := newFake()
	st, s := setup(t, f)
	e := entry(t, st, "k")
	for range 4 {
		require.Equal(t, local.Taken, e.TryTake(1))
	}
	f.fail = true
	require.Error(t, s.Flush(context.Background()))
	assert.Equal(t, int64(1), st.Dirty(), "the entry stays pending")
	assert.Equal(t, int64(0), e.Acked())
	require.Equal(t, local.Taken, e.TryTake(1))
	f.fail = false
	require.NoError(t, s.Flush(context.Background()))
	assert.Equal(t, int64(5), f.applied["k"], "all consumption applied once")
	assert.Equal(t, int64(95_000_000), f.tokens["k"])
	assert.Equal(t, int64(1), s.Stats().FailedKeys.Load())
}

func TestRunFlushesOneIntervalAfterConsumption(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		st, s := setup(t, f)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, 0, f.n(), "an idle store never flushes")
		e := entry(t, st, "k")
		require.Equal(t, local.Taken, e.TryTake(1))
		time.Sleep(19 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 0, f.n())
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 1, f.n())
		assert.Equal(t, int64(1), e.Acked())
		cancel()
		<-done
	})
}

func TestSlowFlushesCoalesce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		f.block = make(chan struct{})
		st, s := setup(t, f)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		e := entry(t, st, "k")
		require.Equal(t, local.Taken, e.TryTake(1))
		time.Sleep(25 * time.Millisecond) // the first flush is stuck in Redis
		for range 5 {                     // meanwhile consumption continues for many intervals
			require.Equal(t, local.Taken, e.TryTake(1))
			time.Sleep(20 * time.Millisecond)
		}
		synctest.Wait()
		close(f.block) // Redis answers; the next flush carries everything at once
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 2, f.n(), "one stuck flush, then one that carries the rest")
		assert.Equal(t, int64(6), f.applied["k"])
		cancel()
		<-done
	})
}

func TestOnErrorAndOnState(t *testing.T) {
	f := newFake()
	st, _ := setup(t, f)
	var states, errs int
	s, err := New(Config{Store: st, Central: f, Interval: time.Millisecond, MaxBatch: 10, Drift: 0.1, Now: mono,
		OnState: func(*local.Entry, central.State) { states++ },
		OnError: func(error) { errs++ }})
	require.NoError(t, err)
	e := entry(t, st, "k")
	require.Equal(t, local.Taken, e.TryTake(1))
	require.NoError(t, s.Flush(context.Background()))
	assert.Equal(t, 1, states)
	f.fail = true
	require.Equal(t, local.Taken, e.TryTake(1))
	assert.True(t, errors.Is(s.Flush(context.Background()), central.ErrUnavailable))
}
