package sync

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/local"
)

// TestShrinkAfterManyKeysLeave checks that the syncer gives back the map and round buffers that a
// round of many keys grew, once the keys have left the store (issue 24: memory back after idling).
func TestShrinkAfterManyKeysLeave(t *testing.T) {
	const n = 20_000
	st, err := local.New(local.Config{MaxKeys: 1 << 16})
	require.NoError(t, err)
	clk := newClock()
	s, err := New(Config{Store: st, Central: newFake(), Interval: 20 * time.Millisecond, MaxBatch: 256, Drift: 0.5,
		Horizon: time.Second, LeaseLife: 2 * time.Second, Now: clk.now})
	require.NoError(t, err)
	ctx := context.Background()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
		e := entry(t, st, keys[i], 2)
		require.Equal(t, local.Taken, e.TryTake(1))
	}
	require.NoError(t, s.Flush(ctx))
	require.Equal(t, n, len(s.waiting), "every key consumed and is watched")
	require.GreaterOrEqual(t, cap(s.entries), n)
	for _, k := range keys {
		require.True(t, st.Remove(k, st.Hash(k)))
	}
	clk.add(time.Second)
	require.NoError(t, s.Flush(ctx))
	if got := len(s.waiting); got != 0 {
		t.Fatalf("%d keys still watched after they left the store", got)
	}
	if s.waitPeak != 0 {
		t.Errorf("the waiting map was not rebuilt: its peak is still %d", s.waitPeak)
	}
	if c := cap(s.entries); c >= shrinkMin {
		t.Errorf("the collect buffer kept a capacity of %d", c)
	}
	if c := cap(s.batch); c >= shrinkMin {
		t.Errorf("the round buffer kept a capacity of %d", c)
	}
}
