package local

import (
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// settle answers every dirty entry's call at time at, as a reconcile that Redis applied would:
// each entry is charged what it consumed and counted, so it is clean.
func settle(s *Store, at int64) {
	for _, e := range s.Collect(nil) {
		c := e.Next(at)
		e.Grant(Answer{Seq: c.Seq, Charged: c.Cum, SentUsed: c.Used, SentCum: c.Cum, Global: 100e6, Active: 1,
			At: at, LeaseUntil: at + 1e9})
	}
}

// TestSweepKeepsWhatMustStay: Sweep evicts a clean key that was idle for two sweeps and for its
// bucket's refill time, and keeps a key used between sweeps, a key with consumption Redis has not
// counted, and a key whose bucket has not refilled since its last answer.
func TestSweepKeepsWhatMustStay(t *testing.T) {
	s := newStore(t, 1<<10)
	idle, busy, pending := insert(t, s, "idle"), insert(t, s, "busy"), insert(t, s, "pending")
	slow := s.Insert("slow", hash(s, "slow"), 0.01, 100, 0) // refills in 10,000 s
	require.NotNil(t, slow)
	for _, e := range []*Entry{idle, busy, pending, slow} {
		e.Add(1)
		e.Touch()
	}
	settle(s, 1e9)
	const sec = int64(1e9)
	assert.Equal(t, 0, s.Sweep(3*sec, sec), "the first sweep only clears the reference bits")
	busy.Touch()
	pending.Add(1) // consumption Redis has not counted
	assert.Equal(t, 1, s.Sweep(4*sec, sec))
	assert.True(t, idle.Evicted())
	assert.Equal(t, Gone, idle.Add(1), "consumption on an evicted entry is not recorded there: the caller looks the key up again")
	assert.Nil(t, s.Lookup("idle", hash(s, "idle")))
	for _, e := range []*Entry{busy, pending, slow} {
		assert.False(t, e.Evicted(), e.Key())
		assert.Same(t, e, s.Lookup(e.Key(), hash(s, e.Key())))
	}
	assert.Equal(t, int64(1), s.Stats().Evictions.Load())
	assert.Equal(t, 3, s.Len())
}

// TestSweepReturnsMemory grows a store to its cap, lets every key go idle, and checks that two
// sweeps leave it empty, its tables back to their first size, and the heap it took returned to the
// OS (after debug.FreeOSMemory, which does at once what the runtime's scavenger does over time).
func TestSweepReturnsMemory(t *testing.T) {
	const maxKeys = 1 << 16
	keys := make([]string, maxKeys)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	held0 := heldFromOS()
	s := newStore(t, maxKeys)
	for _, k := range keys {
		if e := s.Insert(k, hash(s, k), 100, 100, 2); e != nil {
			require.Equal(t, Taken, e.TryTake(1))
		}
	}
	full := s.Len()
	require.Greater(t, full, maxKeys*9/10, "the store holds close to its cap")
	settle(s, 1e9)
	heldFull := heldFromOS()
	grown := int64(heldFull) - int64(held0)
	require.Greater(t, grown, int64(full)*int64(unsafe.Sizeof(Entry{})), "the entries took at least their size each")

	// The first sweep evicts the keys whose reference bit the inserts' CLOCK evictions cleared.
	n := s.Sweep(2e9, 1e9)
	n += s.Sweep(3e9, 1e9)
	assert.Equal(t, full, n, "every idle key was evicted")
	assert.Equal(t, 0, s.Len())
	assert.Equal(t, numShards*minTable, s.TableSlots(), "the tables shrank back")
	heldAfter := heldFromOS()
	t.Logf("held from the OS: %d MB before, %d MB at the cap (%d keys), %d MB after the sweeps",
		held0>>20, heldFull>>20, full, heldAfter>>20)
	assert.Less(t, int64(heldAfter)-int64(held0), grown/4, "the memory went back to the OS")
	runtime.KeepAlive(s)
	runtime.KeepAlive(keys)
}

// heldFromOS returns the heap memory the runtime holds from the OS after a GC that returns what it
// can: HeapSys less HeapReleased.
func heldFromOS() uint64 {
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapSys - ms.HeapReleased
}
