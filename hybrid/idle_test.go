package hybrid_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// TestIdleKeysLeaveMemory: with WithIdleEviction, keys that went idle leave local memory once Redis
// has counted their consumption; a key used again comes back; with idle eviction off they stay.
func TestIdleKeysLeaveMemory(t *testing.T) {
	srv := redistest.Start(t)
	limit := hybrid.Limit{Rate: 1000, Burst: 20} // refills in 20 ms
	ctx := context.Background()
	fill := func(lim *hybrid.Limiter, n int) {
		ev0 := lim.Stats().Evictions
		for i := range n {
			d, err := lim.Decide(ctx, "user:"+strconv.Itoa(i), limit)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		// Each key was added once: it is held, or it went idle and left while the fill went on (a
		// slow run: 500 calls to Redis under -race outlast two sweeps at 50 ms). Eventually, as a
		// sweep in progress has removed keys it has not counted yet.
		require.Eventually(t, func() bool {
			st := lim.Stats()
			return st.Keys+int(st.Evictions-ev0) == n
		}, 5*time.Second, 5*time.Millisecond, "keys held %d, evicted %d, want %d in all",
			lim.Stats().Keys, lim.Stats().Evictions-ev0, n)
	}
	t.Run("on", func(t *testing.T) {
		lim := newLimiter(t, srv.Client(t), hybrid.WithIdleEviction(50*time.Millisecond))
		fill(lim, 500)
		require.Eventually(t, func() bool { return lim.Stats().Keys == 0 }, 10*time.Second, 10*time.Millisecond,
			"idle keys left; %d remain", lim.Stats().Keys)
		assert.GreaterOrEqual(t, lim.Stats().Evictions, int64(500))
		fill(lim, 10)
	})
	t.Run("off", func(t *testing.T) {
		lim := newLimiter(t, srv.Client(t), hybrid.WithIdleEviction(0))
		fill(lim, 500)
		time.Sleep(300 * time.Millisecond)
		assert.Equal(t, 500, lim.Stats().Keys)
		assert.Zero(t, lim.Stats().Evictions)
	})
	t.Run("negative", func(t *testing.T) {
		_, err := hybrid.New(srv.Client(t), hybrid.WithIdleEviction(-time.Second))
		assert.ErrorIs(t, err, hybrid.ErrBadOption)
	})
}
