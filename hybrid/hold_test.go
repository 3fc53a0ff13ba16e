package hybrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// TestBanHoldsAKeyDecidedLocally: the fast path does not look at the deny cache, so a ban must
// reach a key whose entry holds a lease through the entry (it is held). Whichever way the ban
// arrives, the key's next decisions are denied from the deny cache while other keys stay local,
// and once the ban is lifted the key is decided locally again from the lease it kept.
func TestBanHoldsAKeyDecidedLocally(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	limit := hybrid.Limit{Rate: 1e6, Burst: 1e6}
	source := func(lim *hybrid.Limiter, key string) hybrid.Source {
		d, err := lim.Allow(ctx, key, limit)
		require.NoError(t, err)
		require.Equal(t, d.Source != hybrid.SourceDenyCache, d.Allowed, "%s: %+v", key, d)
		return d.Source
	}
	local := func(lim *hybrid.Limiter, key string) {
		t.Helper()
		require.Eventually(t, func() bool { return source(lim, key) == hybrid.SourceLocal }, 5*time.Second,
			time.Millisecond, "%s is decided locally", key)
	}

	t.Run("a ban made on this node denies the key's next decision", func(t *testing.T) {
		lim := newLimiter(t, srv.Client(t), hybrid.WithKeyPrefix("hold1"))
		awaitBans(t, lim)
		local(lim, "a")
		local(lim, "b")
		require.NoError(t, lim.Ban(ctx, "a", time.Hour))
		for i := 0; i < 3; i++ {
			assert.Equal(t, hybrid.SourceDenyCache, source(lim, "a"), "decision %d after the ban", i)
			assert.Equal(t, hybrid.SourceLocal, source(lim, "b"), "another key, decision %d", i)
		}
		require.NoError(t, lim.Unban(ctx, "a"))
		assert.Equal(t, hybrid.SourceLocal, source(lim, "a"), "the first decision after the unban")
		assert.Equal(t, hybrid.SourceLocal, source(lim, "a"), "the second")
	})

	t.Run("a ban made on another node reaches the key's entry here", func(t *testing.T) {
		a := newLimiter(t, srv.Client(t), hybrid.WithKeyPrefix("hold2"))
		b := newLimiter(t, srv.Client(t), hybrid.WithKeyPrefix("hold2"))
		awaitBans(t, b)
		local(b, "k")
		require.NoError(t, a.Ban(ctx, "k", time.Hour))
		require.Eventually(t, func() bool { return source(b, "k") == hybrid.SourceDenyCache }, 5*time.Second,
			time.Millisecond, "the ban reaches b")
		assert.Equal(t, hybrid.SourceDenyCache, source(b, "k"), "and stays")
		require.NoError(t, a.Unban(ctx, "k"))
		local(b, "k")
	})

	t.Run("a key banned before its entry exists gets a held entry", func(t *testing.T) {
		lim := newLimiter(t, srv.Client(t), hybrid.WithKeyPrefix("hold3"))
		awaitBans(t, lim)
		require.NoError(t, lim.Ban(ctx, "new", time.Hour))
		for i := 0; i < 3; i++ {
			assert.Equal(t, hybrid.SourceDenyCache, source(lim, "new"), "decision %d", i)
		}
		require.NoError(t, lim.Unban(ctx, "new"))
		local(lim, "new")
	})
}
