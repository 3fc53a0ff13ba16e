package local

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
