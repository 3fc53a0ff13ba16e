package hybrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// TestBanReachesANodeAfterItsSubscriptionBroke: a node whose ban subscription was cut, or went
// silent, resubscribes (backing off at most a second between attempts) and catches up from the
// change log with the bans made meanwhile, without waiting for its periodic refresh.
func TestBanReachesANodeAfterItsSubscriptionBroke(t *testing.T) {
	if testing.Short() {
		t.Skip("cuts and blackholes a connection for seconds; run without -short")
	}
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	a := newLimiter(t, srv.Client(t))
	b := newLimiter(t, srv.Client(t, func(o *redis.Options) { o.Addr, o.MaxRetries = proxy.Addr, -1 }), hybrid.WithBanRefresh(time.Hour))
	ctx := context.Background()
	limit := hybrid.Limit{Rate: 1000, Burst: 1000}
	banned := func(key string) bool {
		d, err := b.Allow(ctx, key, limit)
		return err == nil && !d.Allowed && d.Source == outcome.SourceDenyCache
	}
	require.NoError(t, a.Ban(ctx, "sub:0", time.Hour))
	require.Eventually(t, func() bool { return banned("sub:0") }, 2*time.Second, 5*time.Millisecond, "Pub/Sub")

	proxy.Cut()
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, a.Ban(ctx, "sub:1", time.Hour)) // its message cannot reach b
	proxy.Restore()
	require.Eventually(t, func() bool { return banned("sub:1") }, 5*time.Second, 10*time.Millisecond, "after a cut")

	proxy.Blackhole(true)
	time.Sleep(3 * time.Second) // the subscription's health check gives up on the silent connection
	require.NoError(t, a.Ban(ctx, "sub:2", time.Hour))
	proxy.Blackhole(false)
	require.Eventually(t, func() bool { return banned("sub:2") }, 5*time.Second, 10*time.Millisecond, "after a blackhole")
}
