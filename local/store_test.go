package local

import (
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

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

func hash(s *Store, key string) uint64 { return s.Hash(key) }

func insert(t *testing.T, s *Store, key string) *Entry {
	t.Helper()
	e := s.Insert(key, hash(s, key), 100, 100, 0)
	require.NotNil(t, e, key)
	return e
}

// leased returns a store of 64 keys and its entry for "k", granted its first answer: charged
// tokens leased until leaseUntil, credit on top.
func leased(t *testing.T, charged, credit, leaseUntil int64) (*Store, *Entry) {
	t.Helper()
	s := newStore(t, 64)
	e := insert(t, s, "k")
	c := e.Next(1)
	e.Grant(Answer{Seq: c.Seq, Charged: charged, Credit: credit, Active: 1, At: 1, LeaseUntil: leaseUntil, SentUsed: c.Used})
	return s, e
}

// grant applies an answer as a reconcile would: charged tokens charged, credit on top, global
// micro-tokens in the bucket.
func grant(e *Entry, charged, credit, global int64) {
	c := e.Next(1)
	e.Grant(Answer{Seq: c.Seq, Charged: charged, Credit: credit, Global: global, Active: 1, SentUsed: c.Used,
		At: 1, LeaseUntil: math.MaxInt64})
}

// hammer calls body(g, i) for i from 0 to n-1 on each of 8 goroutines g, and returns, once they
// are done, every entry a body passed to seen.
func hammer(n int, body func(g, i int, seen func(*Entry))) map[*Entry]bool {
	var (
		mu  sync.Mutex
		all = map[*Entry]bool{}
		wg  sync.WaitGroup
	)
	seen := func(e *Entry) {
		mu.Lock()
		all[e] = true
		mu.Unlock()
	}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				body(g, i, seen)
			}
		}()
	}
	wg.Wait()
	return all
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
		assert.Same(t, e, s.Insert(k, hash(s, k), 100, 100, 0), "insert is idempotent")
	}
	assert.Equal(t, n, s.Len())
	for i := range n {
		k := "key-" + strconv.Itoa(i)
		e := s.Lookup(k, hash(s, k))
		require.NotNil(t, e, k)
		assert.Equal(t, k, e.Key())
	}
	assert.Nil(t, s.Lookup("absent", hash(s, "absent")))
	assert.Nil(t, s.Lookup("", hash(s, "")), "an empty key never inserted is not found")
}

func TestTakeWithinMark(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "k")
	assert.Equal(t, Exhaust, e.TryTake(1), "a new entry without cold-start credit has no allowance")
	grant(e, 4, 1, 50_000_000) // a lease of 4 and a credit of 1
	steps := []struct {
		n    int64
		want TakeResult
	}{{2, Taken}, {3, Taken}, {1, Exhaust}}
	for i, st := range steps {
		assert.Equal(t, st.want, e.TryTake(st.n), "step %d", i)
	}
	assert.Equal(t, int64(5), e.Total())
	assert.True(t, e.Pending(), "one token of credit used: debt to report")
	assert.Equal(t, int64(49), e.Remaining(), "50 global less the token consumed beyond the lease")
	// The next answer charges the debt and grants a new lease: charged 8, credit 0.
	grant(e, 8, 0, 45_000_000)
	assert.Equal(t, int64(8), e.Charged())
	assert.Equal(t, int64(8), e.Mark())
	assert.False(t, e.Pending())
	// An older answer arriving late does not move the mark.
	e.Grant(Answer{Seq: 1, Charged: 100, Credit: 100})
	assert.Equal(t, int64(8), e.Mark())
}

func TestColdStartCredit(t *testing.T) {
	s := newStore(t, 64)
	e := s.Insert("cold", hash(s, "cold"), 100, 100, 2)
	require.NotNil(t, e)
	assert.Equal(t, Taken, e.TryTake(2), "a new key is admitted from its cold-start credit")
	assert.Equal(t, Exhaust, e.TryTake(1))
	assert.True(t, e.Pending(), "the credit used is debt for the first reconcile")
}

func TestLimitIsNotPartOfTheIdentity(t *testing.T) {
	s := newStore(t, 1024)
	a := s.Insert("k", s.Hash("k"), 100, 10, 2)
	require.NotNil(t, a)
	require.Equal(t, Taken, a.TryTake(2))
	b := s.Insert("k", s.Hash("k"), 10, 20, 2)
	assert.Same(t, a, b, "one key under two limits has one entry (one bucket in Redis)")
	assert.Equal(t, Exhaust, b.TryTake(1), "no second cold-start credit for a key whose limit changed")
	rate, burst := b.Limit()
	assert.Equal(t, 100.0, rate, "Insert keeps the entry's limit: the caller sets a new one")
	assert.Equal(t, int64(10), burst)
	b.SetLimit(10, 20)
	assert.True(t, b.HasLimit(10, 20))
	assert.False(t, b.HasLimit(100, 10))
	assert.Same(t, a, s.Lookup("k", s.Hash("k")))
	assert.Equal(t, int64(2), a.Total(), "the counters survive the change")
}

func TestExpireWritesOffTheUnusedLease(t *testing.T) {
	_, e := leased(t, 10, 1, 100)
	require.Equal(t, Taken, e.TryTake(3))
	assert.Equal(t, int64(0), e.Expire(99), "not yet")
	assert.Equal(t, int64(7), e.Expire(100), "7 unused tokens written off")
	assert.Equal(t, int64(10), e.Total())
	assert.Equal(t, int64(7), e.Burned())
	assert.False(t, e.Pending(), "written-off tokens were charged: no debt")
	assert.Equal(t, Taken, e.TryTake(1), "the credit above the charge stays")
	assert.Equal(t, Exhaust, e.TryTake(1))
}

func TestDemandEstimate(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "k")
	e.Seen(1)
	e.Add(4)
	c := e.Next(2e9) // 4 tokens in 2s
	assert.InDelta(t, 1.5, c.Demand, 1e-6, "young: the requests after the first over the life (3 in 2 s)")
	assert.True(t, c.Active)
	e.Deny(6) // denied demand counts too: 6 tokens in 1s
	c = e.Next(3e9)
	assert.InDelta(t, 3.0, c.Demand, 1e-6, "young: 9 after the first in 3 s")
	c = e.Next(4e9)
	assert.False(t, c.Active)
	assert.InDelta(t, 2.25, c.Demand, 1e-6, "young and idle: 9 in 4 s")

	// Past demandEvents requests, the estimate is exponentially weighted.
	e.Add(25)
	c = e.Next(14e9) // 35 seen: mature
	prev := c.Demand
	e.Deny(6) // 6 tokens in 1s
	c = e.Next(15e9)
	decay := math.Exp(-1 / (32 / max(prev, 6))) // τ = 32 events at the larger of the estimate and the observation
	assert.InDelta(t, prev*decay+6*(1-decay), c.Demand, 1e-9)
	prev = c.Demand
	c = e.Next(16e9)
	assert.False(t, c.Active)
	assert.Less(t, c.Demand, prev, "idle: the estimate decays")
	assert.Greater(t, c.Demand, 0.8*prev, "slowly at a few requests a second")
}

// A young key a node sees every 2.3 s (Poisson-like gaps) is estimated at about its rate, 0.43/s,
// not at the 1/s its first request, alone in its first second, would read (youngDemand).
func TestDemandEstimateYoungSparseKey(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "k")
	e.Seen(1)
	now := int64(1)
	e.Add(1)
	now += 20e6
	c := e.Next(now)
	assert.InDelta(t, 0.5, c.Demand, 1e-9, "one request: half a request over the first second")
	for i := range 8 {
		gap := []int64{300e6, 4000e6, 1500e6, 3100e6}[i%4] // 2.225 s on average
		now += gap
		e.Add(1)
		c = e.Next(now + 20e6)
	}
	assert.InDelta(t, 1/2.3, c.Demand, 0.1, "after 9 requests in %v", time.Duration(now))
}

func TestRecentRate(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "k")
	e.Seen(1)
	e.Add(3)
	assert.Equal(t, -1.0, e.RecentRate(2e9), "no call yet")
	e.Next(2e9)
	assert.Zero(t, e.RecentRate(3e9), "nothing since the call")
	e.Add(1)
	e.Deny(2)
	assert.InDelta(t, 3.0, e.RecentRate(2.5e9), 1e-9, "three tokens half a second after the call: over at least a second")
	assert.InDelta(t, 0.1, e.RecentRate(32e9), 1e-9, "three tokens in 30 s")
	assert.Greater(t, e.Demand(), 1.0, "the estimate still says the first call's 1.5/s")
}

// A node that sees a key about once a second, at irregular times (Poisson arrivals: some requests
// come 50 ms after the one before), each request reported by a call 20 ms later, estimates about
// one request a second. The rule before demandTau (each call's observation blended half and half
// with the estimate) read up to 10/s here.
func TestDemandEstimateSparseNode(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "k")
	e.Seen(1)
	now := int64(1)
	var c Call
	for i := range 60 {
		gap := []int64{50e6, 1600e6, 300e6, 2000e6, 1050e6}[i%5] // 1 s on average
		now += gap - 20e6
		e.Add(1)
		now += 20e6
		c = e.Next(now)
		if i >= 20 {
			assert.InDelta(t, 1.0, c.Demand, 0.4, "request %d", i)
		}
	}
}

// A key that turns hot is followed within about a second.
func TestDemandEstimateFollowsAHotKey(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "k")
	e.Seen(1)
	now := int64(1)
	e.Add(1)
	now += 2e9
	c := e.Next(now) // 0.5/s
	for range 15 {   // then 500/s, a call every 100 ms, for 1.5 s
		e.Add(50)
		now += 100e6
		c = e.Next(now)
	}
	assert.Greater(t, c.Demand, 0.9*500)
	assert.LessOrEqual(t, c.Demand, 500.0+1e-9)
}

func TestDirtyListCollectsEachEntryOnce(t *testing.T) {
	s := newStore(t, 1024)
	var es []*Entry
	for i := range 100 {
		e := insert(t, s, "d"+strconv.Itoa(i))
		grant(e, 10, 0, 0)
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
		if s.Lookup(k, hash(s, k)) != nil {
			continue
		}
		e := s.Insert(k, hash(s, k), 100, 100, 0)
		if e == nil {
			continue // its shard is already taken by a pending key
		}
		grant(e, 0, 1, 0) // credit only: a take is debt
		require.Equal(t, Taken, e.TryTake(1))
		pending[k] = e
	}
	require.Len(t, pending, 64)
	// Every shard is full of pending keys: a new key gets no entry, and nothing was evicted.
	full := s.Stats().Full.Load()
	assert.Nil(t, s.Insert("new", hash(s, "new"), 100, 100, 0))
	assert.Equal(t, int64(0), s.Stats().Evictions.Load())
	assert.Equal(t, full+1, s.Stats().Full.Load())
	// Once a reconcile applied the consumption, the entries are clean and can be evicted.
	for _, e := range s.Collect(nil) {
		grant(e, e.Total(), 0, 0)
	}
	e := insert(t, s, "new")
	assert.Equal(t, int64(1), s.Stats().Evictions.Load())
	assert.Equal(t, 64, s.Len())
	assert.NotNil(t, e)
}

func TestEvictedEntryRefusesTakes(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "x")
	grant(e, 10, 0, 0)
	require.True(t, e.tryEvict(), "an unused lease does not keep an entry")
	assert.Equal(t, Gone, e.TryTake(1))
	assert.Equal(t, int64(0), e.Total(), "the refused take was undone")
	assert.Equal(t, Gone, e.Add(1))
}

// TestConcurrentTakesAndEvictionsLoseNothing hammers a small store from many goroutines while keys
// churn through eviction: every token a goroutine was told it took must be in some entry's total,
// and every evicted entry must have had nothing pending.
func TestConcurrentTakesAndEvictionsLoseNothing(t *testing.T) {
	s := newStore(t, 64)
	var granted atomic.Int64
	all := hammer(5000, func(g, i int, seen func(*Entry)) {
		k := "c" + strconv.Itoa((g*7919+i)%300)
		h := hash(s, k)
		e := s.Lookup(k, h)
		if e == nil {
			if e = s.Insert(k, h, 100, 100, 0); e == nil {
				return
			}
			seen(e)
			grant(e, e.Total(), 4, 0)
		}
		if e.TryTake(1) == Taken {
			granted.Add(1)
		}
		if i%3 == 0 { // a reconcile that applies everything, making entries clean again
			for _, d := range s.Collect(nil) {
				grant(d, d.Total(), 4, 0)
			}
		}
	})
	var total int64
	for e := range all {
		total += e.Total()
		if e.Evicted() {
			// Nothing pending: Redis charged all of it. charged may exceed total by a take that a
			// reconcile counted and the eviction handshake then undid: an over-count, never a loss.
			assert.GreaterOrEqual(t, e.Charged(), e.Total(), "an evicted entry had nothing pending")
		}
	}
	assert.Equal(t, granted.Load(), total)
	assert.LessOrEqual(t, s.Len(), 64)
}

func TestHotPathAllocatesNothing(t *testing.T) {
	s := newStore(t, 1024)
	e := insert(t, s, "hot")
	grant(e, math.MaxInt32, 0, 0)
	h := hash(s, "hot")
	allocs := testing.AllocsPerRun(1000, func() {
		if s.Lookup("hot", hash(s, "hot")).TryTake(1) != Taken {
			t.Fatal("take failed")
		}
		_ = h
	})
	assert.Equal(t, 0.0, allocs)
}

// TestDirectCountsWithinAWindow (issue 21): Direct counts one-off takes within a window and starts
// a new window once the last one ended.
func TestDirectCountsWithinAWindow(t *testing.T) {
	s, err := New(Config{MaxKeys: 1024})
	if err != nil {
		t.Fatal(err)
	}
	e := s.Insert("k", s.Hash("k"), 1, 2, 0)
	const w = int64(8e9)
	for i, c := range []struct{ at, want int64 }{{1, 1}, {2e9, 2}, {8e9, 3}, {8e9 + 2, 1}, {9e9, 2}} {
		if got := e.Direct(c.at, w); got != c.want {
			t.Errorf("take %d at %d: Direct = %d, want %d", i, c.at, got, c.want)
		}
	}
	if e.Total() != 0 || e.Pending() {
		t.Errorf("one-off takes are not the entry's consumption: total %d", e.Total())
	}
}

// TestTakeLeavesAHeldEntryAlone: Store.Take returns nil for a held entry and takes nothing, while
// TryTake (the long way's take) still takes; Release gives the entry back to Take unless Config.Held
// still reports the key, and an entry of a key Config.Held reports is inserted held.
func TestTakeLeavesAHeldEntryAlone(t *testing.T) {
	var banned atomic.Bool
	s, err := New(Config{MaxKeys: 64, Held: func(key string) bool { return key == "k" && banned.Load() }})
	require.NoError(t, err)
	h := hash(s, "k")
	e := s.Insert("k", h, 100, 100, 10)
	require.NotNil(t, e)
	require.Same(t, e, s.Take("k", h, 100, 100, 1), "an entry not held")
	banned.Store(true)
	assert.True(t, s.Hold("k", h))
	assert.False(t, s.Hold("absent", hash(s, "absent")), "no entry to hold")
	assert.True(t, e.Held())
	assert.Nil(t, s.Take("k", h, 100, 100, 1), "held")
	assert.Equal(t, int64(1), e.Total(), "Take took nothing from the held entry")
	assert.Equal(t, Taken, e.TryTake(1), "TryTake is not held")
	assert.False(t, s.Release(e), "Held still reports the key")
	assert.True(t, e.Held())
	banned.Store(false)
	assert.True(t, s.Release(e))
	assert.False(t, e.Held())
	assert.Same(t, e, s.Take("k", h, 100, 100, 1), "released")
	assert.Equal(t, int64(3), e.Total())

	banned.Store(true)
	require.True(t, s.Remove("k", h))
	e2 := s.Insert("k", h, 100, 100, 10)
	require.NotNil(t, e2)
	assert.True(t, e2.Held(), "inserted held")
	assert.Nil(t, s.Take("k", h, 100, 100, 1))
}

// TestTakenCountsEveryDecision: Store.Take counts its decisions in the entries' words, and
// Stats.Taken gets each of them exactly once, through Collect, an eviction, a Remove or a wrap of
// an entry's count, while goroutines take, collect, evict and remove concurrently (run with -race).
// After a last Collect with no take running, Taken equals the takes that returned an entry.
func TestTakenCountsEveryDecision(t *testing.T) {
	s := newStore(t, 64)
	var took atomic.Int64
	all := hammer(20_000, func(g, i int, seen func(*Entry)) {
		k := "c" + strconv.Itoa((g*7919+i*(1+i%3))%(70+g))
		h := hash(s, k)
		if e := s.Take(k, h, 100, 100, 1); e != nil {
			took.Add(1)
			return
		}
		e := s.Insert(k, h, 100, 100, 0)
		if e == nil {
			return
		}
		seen(e)
		if e.Mark()-e.Total() < 1 {
			grant(e, e.Total(), 1_000, 0)
		}
		switch {
		case i%50 == 0: // a reconcile that applies everything, making entries clean (evictable) again
			for _, d := range s.Collect(nil) {
				grant(d, d.Total(), 1_000, 0)
			}
		case i%997 == 0:
			s.Remove(k, h)
		}
	})
	s.Collect(nil)
	assert.Equal(t, took.Load(), s.Stats().Taken.Load(), "every decision counted once")
	for e := range all {
		assert.Zero(t, takes(e.word.Load()), "nothing left uncounted in %s", e.Key())
	}
	assert.Positive(t, s.Stats().Evictions.Load(), "keys churned through eviction")
}

// TestTakenWrapsEvery256: an entry that is never collected hands its count over every 256 decisions;
// the rest comes with the next Collect, and the tokens are unaffected by the count.
func TestTakenWrapsEvery256(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "hot")
	grant(e, 0, 10_000, 0)
	h := hash(s, "hot")
	for range 1000 {
		require.NotNil(t, s.Take("hot", h, 100, 100, 2))
	}
	assert.EqualValues(t, 3*256, s.Stats().Taken.Load())
	assert.EqualValues(t, 2000, e.Total(), "the count is not part of the tokens")
	assert.EqualValues(t, 1000-3*256, takes(e.word.Load()))
	s.Collect(nil)
	assert.EqualValues(t, 1000, s.Stats().Taken.Load())
	assert.Zero(t, takes(e.word.Load()))
	assert.EqualValues(t, 2000, e.Total())
	require.Equal(t, Taken, e.TryTake(1), "TryTake counts no decision")
	s.Collect(nil)
	assert.EqualValues(t, 1000, s.Stats().Taken.Load())
}

// TestUntakeGivesTheDecisionBack: a take that finds its entry evicted is undone, decision included,
// whether its decision is still in the entry's count or was already folded into Stats.Taken.
func TestUntakeGivesTheDecisionBack(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "x")
	grant(e, 0, 100, 0)
	h := hash(s, "x")
	require.NotNil(t, s.Take("x", h, 100, 100, 1))
	require.NotNil(t, s.Take("x", h, 100, 100, 1))
	s.untake(e, 1) // in the count
	assert.EqualValues(t, 1, takes(e.word.Load()))
	assert.EqualValues(t, 1, e.Total())
	s.fold(e)
	assert.EqualValues(t, 1, s.Stats().Taken.Load())
	s.untake(e, 1) // already folded
	assert.Zero(t, s.Stats().Taken.Load())
	assert.Zero(t, e.Total())
	assert.Zero(t, takes(e.word.Load()))
}

// TestFlyOneCallAtATime: the first caller flies; the others register their demand and wait until it
// lands, then report false; an entry sharing the first one's stripe (both hash 0) flies and lands
// on its own meanwhile.
func TestFlyOneCallAtATime(t *testing.T) {
	var e, other Entry
	require.True(t, e.Fly(1))
	var wg sync.WaitGroup
	var back atomic.Int32
	for _, n := range []int64{2, 3} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !e.Fly(n) {
				back.Add(1)
			}
		}()
	}
	require.Eventually(t, func() bool { return e.Waiters() == 5 }, 5*time.Second, time.Millisecond)
	require.True(t, other.Fly(1), "another entry of the same stripe is not in flight")
	other.Land()
	time.Sleep(10 * time.Millisecond)
	assert.Zero(t, back.Load(), "the waiters wait for their own entry's call")
	e.Land()
	wg.Wait()
	assert.EqualValues(t, 2, back.Load())
	assert.Zero(t, e.Waiters())
	require.True(t, e.Fly(1), "nothing in flight after Land")
	e.Land()
}

// TestFlyNeverTwo: under -race, callers on a few entries (sharing stripes) never have two calls of
// one entry in flight, and every waiter comes back.
func TestFlyNeverTwo(t *testing.T) {
	es := make([]Entry, 3)
	inFlight := make([]atomic.Int32, len(es))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				k := (g + i) % len(es)
				if es[k].Fly(1) {
					if inFlight[k].Add(1) != 1 {
						t.Error("two calls in flight")
					}
					if i%16 == 0 {
						time.Sleep(time.Microsecond)
					}
					inFlight[k].Add(-1)
					es[k].Land()
				}
			}
		}()
	}
	wg.Wait()
	for k := range es {
		assert.Zero(t, es[k].Waiters())
		assert.Zero(t, es[k].flags.v.Load()&(fFly|fWait))
	}
}

// TestSeqWraps: call numbers are compared modulo 2^32, so answers keep their order across the wrap:
// the latest answer applies, an older one after it is ignored, and an answer to a call not issued
// yet is ignored.
func TestSeqWraps(t *testing.T) {
	s := newStore(t, 1024)
	e := insert(t, s, "k")
	assert.Nil(t, e.calls.Load(), "no calls part before the first call")
	k := func() *calls { e.Seen(1); return e.calls.Load() }()
	k.seq, k.applied = math.MaxUint32-1, math.MaxUint32-1
	c1 := e.Next(2) // MaxUint32
	c2 := e.Next(3) // 0, wrapped
	c3 := e.Next(4) // 1
	require.EqualValues(t, uint32(math.MaxUint32), c1.Seq)
	require.EqualValues(t, 0, c2.Seq)
	e.Grant(Answer{Seq: c2.Seq, Charged: 20, Credit: 0, Active: 1, At: 3, LeaseUntil: 100})
	assert.EqualValues(t, 20, e.Charged())
	e.Grant(Answer{Seq: c1.Seq, Charged: 30, Credit: 5, Active: 1, At: 2, LeaseUntil: 100})
	assert.EqualValues(t, 20, e.Mark(), "an answer older than the one applied is ignored")
	e.Grant(Answer{Seq: c3.Seq + 1, Charged: 40, Active: 1, At: 4, LeaseUntil: 100})
	assert.EqualValues(t, 20, e.Charged(), "an answer to a call not issued is ignored")
	e.Grant(Answer{Seq: c3.Seq, Charged: 30, Credit: 1, Active: 1, At: 4, LeaseUntil: 100})
	assert.EqualValues(t, 31, e.Mark())
	assert.EqualValues(t, 4, e.GrantedAt())
}

// split returns a store and its entry "k", split, with an allowance of mark tokens (charged, no
// credit) leased until leaseUntil.
func splitEntry(t *testing.T, mark, leaseUntil int64) (*Store, *Entry) {
	t.Helper()
	s, e := leased(t, mark, 0, leaseUntil)
	e.doSplit()
	require.True(t, e.Split())
	return s, e
}

// held returns the tokens e's slots hold.
func held(e *Entry) int64 {
	n := int64(0)
	for i := range e.rare.Load().split.Load().slots {
		n += tot(e.rare.Load().split.Load().slots[i].word.Load())
	}
	return n
}

// TestSplitAfterLostCASes: the eighth CAS lost within a window splits the entry; a window ends at
// the 256th decision (the count's wrap) and at Collect, and seven lost in each never split it.
func TestSplitAfterLostCASes(t *testing.T) {
	s, e := leased(t, 1<<20, 0, math.MaxInt64)
	h := hash(s, "k")
	for range 7 {
		s.contended(e)
	}
	assert.False(t, e.Split())
	s.Collect(nil) // e is not dirty: nothing collected, nothing reset
	for range 256 {
		require.NotNil(t, s.Take("k", h, 100, 100, 1))
	}
	assert.Zero(t, e.flags.v.Load()&lostMask, "the 256th decision starts a new window")
	for range 7 {
		s.contended(e)
	}
	s.Collect(nil)
	assert.Zero(t, e.flags.v.Load()&lostMask, "Collect starts a new window")
	for range 7 {
		s.contended(e)
	}
	assert.False(t, e.Split())
	s.contended(e)
	assert.True(t, e.Split(), "the eighth lost CAS of a window splits")
	require.NotNil(t, e.rare.Load().split.Load())
	assert.Zero(t, e.flags.v.Load()&lostMask)
	assert.EqualValues(t, uintptr(64), unsafe.Sizeof(slot{}))
}

// TestSplitNeverAdmitsBeyondTheMark: a split entry admits exactly its mark, one goroutine or many,
// whatever the slots hold when the allowance runs out, and its counters read what was admitted.
func TestSplitNeverAdmitsBeyondTheMark(t *testing.T) {
	t.Parallel()
	for _, g := range []int{1, 8} {
		t.Run("goroutines="+strconv.Itoa(g), func(t *testing.T) {
			s, e := splitEntry(t, 10_000, math.MaxInt64)
			h := hash(s, "k")
			var took, decisions atomic.Int64
			var wg sync.WaitGroup
			for range g {
				wg.Go(func() {
					for s.Take("k", h, 100, 100, 1+int64(rand.IntN(3))) != nil || s.Take("k", h, 100, 100, 1) != nil {
						decisions.Add(1)
					}
				})
			}
			wg.Wait()
			for ; s.Take("k", h, 100, 100, 1) != nil; decisions.Add(1) {
			}
			took.Store(e.Total())
			assert.EqualValues(t, 10_000, took.Load(), "the whole mark, and no more")
			assert.Equal(t, Exhaust, e.TryTake(1))
			assert.Nil(t, s.Take("k", h, 100, 100, 1))
			s.Collect(nil)
			assert.Equal(t, decisions.Load(), s.Stats().Taken.Load(), "every decision counted once")
			c := e.Next(2)
			assert.EqualValues(t, 10_000, c.Used)
			assert.EqualValues(t, 10_000, c.Cum)
			assert.Zero(t, held(e))
		})
	}
}

// TestSplitSlotTokensComeBack: tokens moved to a slot and not admitted are not consumption: not in
// Total, Unused, Pending or the call's counts, written off by Expire, and available to TryTake and a
// Refund's caller; Remaining, an estimate read on every decision, counts them as spent.
func TestSplitSlotTokensComeBack(t *testing.T) {
	s, e := splitEntry(t, 1000, 10)
	h := hash(s, "k")
	for range 10 {
		require.NotNil(t, s.Take("k", h, 100, 100, 1))
	}
	require.Positive(t, held(e), "a chunk went to a slot")
	assert.EqualValues(t, 10+held(e), tot(e.word.Load()), "the chunk is in the word's total")
	assert.EqualValues(t, 10, e.Total())
	assert.EqualValues(t, 990, e.Unused())
	assert.False(t, e.Pending())
	assert.True(t, e.Unreported())
	assert.EqualValues(t, 1000-10-held(e), e.Remaining(), "the unused lease (the bucket was empty), less what the slots hold")
	assert.LessOrEqual(t, held(e), int64(990/2), "the slots hold at most half the allowance left")
	assert.Equal(t, Taken, e.TryTake(985), "TryTake gets the slots' tokens back when it needs them")
	assert.EqualValues(t, 995, e.Total())
	assert.Nil(t, s.Take("k", h, 100, 100, 6))
	require.NotNil(t, s.Take("k", h, 100, 100, 5))
	assert.EqualValues(t, 3, e.Refund(3, 5))
	assert.EqualValues(t, 997, e.Total())
	require.NotNil(t, s.Take("k", h, 100, 100, 1))
	assert.EqualValues(t, 2, e.Expire(10), "the lease's last two tokens, wherever they were")
	assert.EqualValues(t, 1000, e.Total())
	c := e.Next(11)
	assert.EqualValues(t, 998, c.Used, "admitted: 10 + 985 + 5 − 3 + 1")
	assert.EqualValues(t, 1000, c.Cum)
}

// TestSplitAccountingUnderLoad (run it with -race): eight goroutines take from a split key while a
// syncer collects, reports and grants more, and leases expire; at the end the tokens reported as
// used are the tokens admitted, every decision is counted once, and total never passed the mark.
func TestSplitAccountingUnderLoad(t *testing.T) {
	t.Parallel()
	s, e := splitEntry(t, 500, 1)
	h := hash(s, "k")
	var (
		admitted, decisions atomic.Int64
		stop                atomic.Bool
		wg                  sync.WaitGroup
	)
	for g := range 8 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				n := int64(1 + (g+i)%3)
				if s.Take("k", h, 100, 100, n) != nil {
					admitted.Add(n)
					decisions.Add(1)
				} else if g == 0 && i%7 == 0 && e.TryTake(1) == Taken {
					admitted.Add(1)
				}
			}
		})
	}
	var reported int64
	now := int64(1)
	for round := range 400 {
		s.Collect(nil)
		now++
		if round%5 == 0 {
			e.Expire(now) // the lease ended at now−1: what is left of it is written off
		}
		c := e.Next(now)
		require.GreaterOrEqual(t, c.Used, reported, "Used never goes back")
		reported = c.Used
		require.LessOrEqual(t, c.Cum, e.Mark(), "total never passes the mark")
		// A take counts in admitted just after it returns: up to one take a goroutine (3 tokens) late.
		require.LessOrEqual(t, c.Used, admitted.Load()+8*3, "never reported before it was admitted")
		e.Grant(Answer{Seq: c.Seq, Charged: c.Cum + 50, Credit: 5, Active: 1, SentUsed: c.Used, At: now,
			LeaseUntil: now + 1})
	}
	stop.Store(true)
	wg.Wait()
	c := e.Next(now + 1)
	assert.Equal(t, admitted.Load(), c.Used, "reported as used = admitted")
	assert.Equal(t, c.Cum, c.Used+e.Burned())
	assert.LessOrEqual(t, c.Cum, e.Mark())
	s.Collect(nil)
	assert.Equal(t, decisions.Load(), s.Stats().Taken.Load(), "every decision counted once")
	assert.Positive(t, e.Burned(), "leases expired with tokens left")
}

// TestSplitTakesAndEvictionsLoseNothing: split keys churn through eviction while eight goroutines
// take from them: every token a take admitted is in some entry's total, every decision is counted
// once, and an evicted entry had nothing Redis did not charge.
func TestSplitTakesAndEvictionsLoseNothing(t *testing.T) {
	t.Parallel()
	s := newStore(t, 64)
	var took, decisions atomic.Int64
	all := hammer(5000, func(g, i int, seen func(*Entry)) {
		k := "c" + strconv.Itoa((g*7919+i)%300)
		h := hash(s, k)
		if s.Take(k, h, 100, 100, 1) != nil {
			took.Add(1)
			decisions.Add(1)
			return
		}
		e := s.Lookup(k, h)
		if e == nil {
			if e = s.Insert(k, h, 100, 100, 0); e == nil {
				return
			}
			seen(e)
			e.doSplit()
			grant(e, e.Total(), 40, 0)
		}
		if e.TryTake(1) == Taken {
			took.Add(1)
		}
		if i%3 == 0 { // a reconcile that applies everything, making entries clean again
			for _, d := range s.Collect(nil) {
				grant(d, d.Total(), 40, 0)
			}
		}
	})
	var total int64
	for e := range all {
		total += e.total()
		if e.Evicted() {
			assert.GreaterOrEqual(t, e.Charged(), e.total(), "an evicted entry had nothing pending")
		}
	}
	assert.Equal(t, took.Load(), total)
	s.Collect(nil)
	for e := range all {
		if !e.Evicted() {
			s.fold(e)
		}
	}
	assert.Equal(t, decisions.Load(), s.Stats().Taken.Load())
	assert.Positive(t, s.Stats().Evictions.Load())
}

// TestUniformKeysStayUnsplit: on 1,024 keys drawn at random by two goroutines (as
// BenchmarkAllow's keys=1k rows), takes rarely meet on one key, and the trigger (8 lost CASes
// within 256 decisions) splits none.
func TestUniformKeysStayUnsplit(t *testing.T) {
	t.Parallel()
	s := newStore(t, 1<<12)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
		s.Insert(keys[i], hash(s, keys[i]), 1e9, 1e9, 1<<62)
	}
	seq := make([]int, 1<<16)
	for i := range seq {
		seq[i] = rand.IntN(len(keys))
	}
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			for i := range 1_000_000 {
				k := keys[seq[(i+g*104_729)&(len(seq)-1)]]
				if s.Take(k, hash(s, k), 1e9, 1e9, 1) == nil {
					t.Error("not taken")
					return
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, s.Stats().Splits.Load(), "uniform keys split")
}
