package local

import (
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newStore(t *testing.T, maxKeys int) *Store {
	t.Helper()
	s, err := New(Config{MaxKeys: maxKeys})
	require.NoError(t, err)
	return s
}

func insert(t *testing.T, s *Store, key string) *Entry {
	t.Helper()
	e := s.Insert(key, s.Hash(key))
	require.NotNil(t, e, key)
	return e
}

func TestNewRejectsTinyCap(t *testing.T) {
	_, err := New(Config{MaxKeys: 10})
	assert.Error(t, err)
}

func TestInsertLookupGrow(t *testing.T) {
	s := newStore(t, 1<<20)
	const n = 10_000
	for i := range n {
		k := "key-" + strconv.Itoa(i)
		e := insert(t, s, k)
		assert.Same(t, e, s.Insert(k, s.Hash(k)), "insert is idempotent")
	}
	assert.Equal(t, n, s.Len())
	for i := range n {
		k := "key-" + strconv.Itoa(i)
		e := s.Lookup(k, s.Hash(k))
		require.NotNil(t, e, k)
		assert.Equal(t, k, e.Key())
	}
	assert.Nil(t, s.Lookup("absent", s.Hash("absent")))
	assert.Nil(t, s.Lookup("", s.Hash("")), "the tombstone's empty key never matches")
}

func TestTakeWithinMark(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "k")
	assert.Equal(t, Exhaust, e.TryTake(1), "a new entry has no allowance")
	e.Grant(0, 5, 50_000_000, 1, 0, 1)
	steps := []struct {
		n    int64
		want TakeResult
	}{{2, Taken}, {3, Taken}, {1, Exhaust}}
	for i, st := range steps {
		assert.Equal(t, st.want, e.TryTake(st.n), "step %d", i)
	}
	assert.Equal(t, int64(5), e.Total())
	assert.Equal(t, int64(45), e.Remaining(), "50 global less 5 consumed since the answer")
	// A reconcile answer: Redis applied 5; new allowance 3 on top.
	e.Grant(5, 3, 45_000_000, 2, 0, 1)
	assert.Equal(t, int64(5), e.Acked())
	assert.Equal(t, int64(8), e.Mark())
	// An older answer (applied 4) arriving late does not move the mark back.
	e.Grant(4, 100, 0, 1, 0, 1)
	assert.Equal(t, int64(8), e.Mark())
}

func TestDirtyListCollectsEachEntryOnce(t *testing.T) {
	s := newStore(t, 1024)
	var es []*Entry
	for i := range 100 {
		e := insert(t, s, "d"+strconv.Itoa(i))
		e.Grant(0, 10, 0, 1, 0, 1)
		es = append(es, e)
	}
	for _, e := range es {
		require.Equal(t, Taken, e.TryTake(1))
		require.Equal(t, Taken, e.TryTake(1))
	}
	select {
	case <-s.Notify():
	default:
		t.Fatal("no notification on the first dirty entry")
	}
	assert.Equal(t, int64(100), s.Dirty())
	got := s.Collect(nil)
	assert.Len(t, got, 100)
	assert.Equal(t, int64(0), s.Dirty())
	assert.Empty(t, s.Collect(nil))
	require.Equal(t, Taken, es[3].TryTake(1))
	assert.Equal(t, []*Entry{es[3]}, s.Collect(nil))
}

func TestEvictionSkipsPendingEntries(t *testing.T) {
	s := newStore(t, 64) // one key per shard
	// Fill the store with keys that have pending consumption.
	pending := map[string]*Entry{}
	for i := 0; len(pending) < 64 && i < 100_000; i++ {
		k := "p" + strconv.Itoa(i)
		if s.Lookup(k, s.Hash(k)) != nil {
			continue
		}
		e := s.Insert(k, s.Hash(k))
		if e == nil {
			continue // its shard is already taken by a pending key
		}
		e.Grant(0, 1, 0, 1, 0, 1)
		require.Equal(t, Taken, e.TryTake(1))
		pending[k] = e
	}
	require.Len(t, pending, 64)
	// Every shard is full of pending keys: a new key gets no entry, and nothing was evicted.
	full := s.Stats().Full.Load()
	assert.Nil(t, s.Insert("new", s.Hash("new")))
	assert.Equal(t, int64(0), s.Stats().Evictions.Load())
	assert.Equal(t, full+1, s.Stats().Full.Load())
	// Once a reconcile applied the consumption, the entries are clean and can be evicted.
	for _, e := range s.Collect(nil) {
		e.Grant(e.Total(), 0, 0, 1, 0, 1)
	}
	e := insert(t, s, "new")
	assert.Equal(t, int64(1), s.Stats().Evictions.Load())
	assert.Equal(t, 64, s.Len())
	assert.NotNil(t, e)
}

func TestEvictedEntryRefusesTakes(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "x")
	e.Grant(0, 10, 0, 1, 0, 1)
	require.True(t, e.tryEvict())
	assert.Equal(t, Gone, e.TryTake(1))
	assert.Equal(t, int64(0), e.Total(), "the refused take was undone")
	assert.Equal(t, Gone, e.Add(1))
}

// TestConcurrentTakesAndEvictionsLoseNothing hammers a small store from many goroutines while keys
// churn through eviction: every token a goroutine was told it took must be in some entry's total,
// and every evicted entry must have had nothing pending.
func TestConcurrentTakesAndEvictionsLoseNothing(t *testing.T) {
	s := newStore(t, 64)
	var (
		mu      sync.Mutex
		all     = map[*Entry]bool{}
		granted atomic.Int64
		wg      sync.WaitGroup
	)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5000 {
				k := "c" + strconv.Itoa((g*7919+i)%300)
				h := s.Hash(k)
				e := s.Lookup(k, h)
				if e == nil {
					if e = s.Insert(k, h); e == nil {
						continue
					}
					mu.Lock()
					all[e] = true
					mu.Unlock()
					e.Grant(e.Total(), 4, 0, 1, 0, 1)
				}
				if e.TryTake(1) == Taken {
					granted.Add(1)
				}
				if i%3 == 0 { // a reconcile that applies everything, making entries clean again
					for _, d := range s.Collect(nil) {
						d.Grant(d.Total(), 4, 0, 1, 0, 1)
					}
				}
			}
		}()
	}
	wg.Wait()
	var total int64
	for e := range all {
		total += e.Total()
		if e.Evicted() {
			// Nothing pending: Redis applied all of it. acked may exceed total by a take that a
			// reconcile counted and the eviction handshake then undid: an over-count, never a loss.
			assert.GreaterOrEqual(t, e.Acked(), e.Total(), "an evicted entry had nothing pending")
		}
	}
	assert.Equal(t, granted.Load(), total)
	assert.LessOrEqual(t, s.Len(), 64)
}

func TestHotPathAllocatesNothing(t *testing.T) {
	s := newStore(t, 1024)
	e := insert(t, s, "hot")
	e.Grant(0, math.MaxInt32, 0, 1, 0, 1)
	h := s.Hash("hot")
	allocs := testing.AllocsPerRun(1000, func() {
		if s.Lookup("hot", s.Hash("hot")).TryTake(1) != Taken {
			t.Fatal("take failed")
		}
		_ = h
	})
	assert.Equal(t, 0.0, allocs)
}

func TestAllowance(t *testing.T) {
	for _, tc := range []struct {
		drift, global, rate, interval float64
		active                        int64
		want                          int64
	}{
		{0.1, 1000, 100, 0.02, 1, 102}, // 0.1·1000 + 100·0.02
		{0.1, 1000, 100, 0.02, 8, 12},  // split across 8 nodes
		{0.1, 5, 100, 0.02, 1, 2},      // near empty: the refill share remains (0.5 + 2)
		{0.1, -1, 100, 0.02, 1, 1},     // debt is repaid first: 2 - 1
		{0.1, -5, 100, 0.02, 1, 0},     // deeper debt: nothing
		{0, 1000, 100, 0.02, 1, 0},     // drift 0: strict central
		{1, 3, 0, 0.02, 0, 3},          // active 0 treated as 1
		{0.1, math.NaN(), 1, 1, 1, 0},  // never trust a NaN
		{1, 1e300, 1, 1, 1, 1 << 52},   // capped
	} {
		assert.Equal(t, tc.want, Allowance(tc.drift, tc.global, tc.rate, tc.interval, tc.active, 0), "%+v", tc)
	}
}
