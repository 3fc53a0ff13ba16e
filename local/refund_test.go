package local

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRefundMakesTokensTakeableAgain(t *testing.T) {
	_, e := leased(t, 4, 0, 100)
	steps := []struct {
		op        string // "take" or "refund"
		n         int64
		wantTake  TakeResult
		wantGiven int64
		wantTotal int64
	}{
		{"take", 3, Taken, 0, 3},
		{"take", 2, Exhaust, 0, 3},
		{"refund", 2, 0, 2, 1},
		{"take", 2, Taken, 0, 3},
		{"take", 1, Taken, 0, 4},
		{"refund", 10, 0, 4, 0}, // never more than admitted
		{"refund", 1, 0, 0, 0},
		{"take", 4, Taken, 0, 4},
	}
	for i, st := range steps {
		switch st.op {
		case "take":
			assert.Equal(t, st.wantTake, e.TryTake(st.n), "step %d", i)
		case "refund":
			assert.Equal(t, st.wantGiven, e.Refund(st.n, 50), "step %d", i)
		}
		assert.Equal(t, st.wantTotal, e.Total(), "step %d", i)
	}
	assert.False(t, e.Pending(), "refunds never create debt")
}

func TestRefundReducesDebt(t *testing.T) {
	_, e := leased(t, 2, 2, 100)
	require.Equal(t, Taken, e.TryTake(4)) // 2 of lease, 2 of credit: 2 of debt
	require.True(t, e.Pending())
	assert.Equal(t, int64(2), e.Refund(2, 50))
	assert.False(t, e.Pending(), "the refunded tokens were the debt")
	assert.Equal(t, int64(0), e.Unused())
}

func TestRefundIntoAnExpiredLeaseWritesItOff(t *testing.T) {
	_, e := leased(t, 10, 0, 100)
	require.Equal(t, Taken, e.TryTake(3))
	require.Equal(t, int64(7), e.Expire(100)) // the syncer writes off the unused lease
	assert.Equal(t, int64(2), e.Refund(2, 100), "the caller gets its refund")
	assert.Equal(t, int64(0), e.Unused(), "but the lease's life is over: nothing to take again")
	assert.Equal(t, int64(9), e.Burned())
	assert.Equal(t, int64(1), e.Total()-e.Burned(), "used: 3 admitted, 2 refunded")
	assert.Equal(t, Exhaust, e.TryTake(1))
	assert.Equal(t, int64(1), e.Refund(5, 100), "at most what is still used")
	assert.Equal(t, int64(0), e.Refund(1, 100))
}

func TestRefundAfterReportNeverGoesBelowZeroOrBurned(t *testing.T) {
	_, e := leased(t, 10, 0, 100)
	require.Equal(t, Taken, e.TryTake(5))
	c := e.Next(2)
	require.Equal(t, int64(5), c.Used)
	e.Grant(Answer{Seq: c.Seq, Charged: 10, Active: 1, SentUsed: c.Used, SentCum: c.Cum, At: 2, LeaseUntil: 100})
	assert.Equal(t, int64(5), e.Refund(9, 50))
	c = e.Next(3)
	assert.Equal(t, int64(0), c.Cum)
	assert.Equal(t, int64(0), c.Used)
	assert.GreaterOrEqual(t, c.Demand, 0.0, "a refund is no negative demand (reconcile.lua rejects one)")
	assert.False(t, e.Unreported(), "Redis counted more than is used now: nothing to report")
}

func TestRefundOfAnEvictedEntryGivesNothing(t *testing.T) {
	s := newStore(t, 64)
	e := insert(t, s, "k")
	require.True(t, s.Remove("k", hash(s, "k")))
	assert.Equal(t, int64(0), e.Refund(1, 0))
}

func TestRemoveDropsTheEntryWhateverItHolds(t *testing.T) {
	// Room for both keys whatever shard they hash to: with 64 keys (one per shard) inserting
	// "other" evicts the clean "k" when the two share a shard (1 run in 64 failed in CI).
	s := newStore(t, 64*numShards)
	e := insert(t, s, "k")
	other := insert(t, s, "other")
	e.Add(5) // pending: eviction would keep it, Remove does not
	assert.True(t, s.Remove("k", hash(s, "k")))
	assert.False(t, s.Remove("k", hash(s, "k")), "already gone")
	assert.True(t, e.Evicted())
	assert.NotEqual(t, Taken, e.TryTake(1))
	assert.Nil(t, s.Lookup("k", hash(s, "k")))
	assert.Same(t, other, s.Lookup("other", hash(s, "other")))
	assert.Equal(t, 1, s.Len())
	fresh := insert(t, s, "k")
	assert.NotSame(t, e, fresh)
	assert.Equal(t, int64(0), fresh.Total(), "a new incarnation starts from nothing")
}

func TestConcurrentTakesAndRefundsStayWithinTheLease(t *testing.T) {
	_, e := leased(t, 100, 0, 1<<62)
	var wg sync.WaitGroup
	var mu sync.Mutex
	held := int64(0) // tokens taken and not refunded
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				if e.TryTake(3) != Taken {
					continue
				}
				got := e.Refund(int64(1+i%3), 2)
				mu.Lock()
				held += 3 - got
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, held, e.Total(), "every take and refund is accounted for")
	assert.LessOrEqual(t, e.Total(), int64(100), "never beyond the lease")
}
