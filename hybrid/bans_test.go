package hybrid_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
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
		d, err := b.Decide(ctx, key, limit)
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

// TestBanHoldsAKeyDecidedLocally: the fast path does not look at the deny cache, so a ban must
// reach a key whose entry holds a lease through the entry (it is held). Whichever way the ban
// arrives, the key's next decisions are denied from the deny cache while other keys stay local,
// and once the ban is lifted the key is decided locally again from the lease it kept.
func TestBanHoldsAKeyDecidedLocally(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	limit := hybrid.Limit{Rate: 1e6, Burst: 1e6}
	source := func(lim *hybrid.Limiter, key string) outcome.Source {
		d, err := lim.Decide(ctx, key, limit)
		require.NoError(t, err)
		require.Equal(t, d.Source != outcome.SourceDenyCache, d.Allowed, "%s: %+v", key, d)
		return d.Source
	}
	local := func(lim *hybrid.Limiter, key string) {
		t.Helper()
		require.Eventually(t, func() bool { return source(lim, key) == outcome.SourceLocal }, 5*time.Second,
			time.Millisecond, "%s is decided locally", key)
	}

	t.Run("a ban made on this node denies the key's next decision", func(t *testing.T) {
		lim := newLimiter(t, srv.Client(t), hybrid.WithKeyPrefix("hold1"))
		awaitBans(t, lim)
		local(lim, "a")
		local(lim, "b")
		require.NoError(t, lim.Ban(ctx, "a", time.Hour))
		for i := 0; i < 3; i++ {
			assert.Equal(t, outcome.SourceDenyCache, source(lim, "a"), "decision %d after the ban", i)
			assert.Equal(t, outcome.SourceLocal, source(lim, "b"), "another key, decision %d", i)
		}
		require.NoError(t, lim.Unban(ctx, "a"))
		assert.Equal(t, outcome.SourceLocal, source(lim, "a"), "the first decision after the unban")
		assert.Equal(t, outcome.SourceLocal, source(lim, "a"), "the second")
	})

	t.Run("a ban made on another node reaches the key's entry here", func(t *testing.T) {
		a := newLimiter(t, srv.Client(t), hybrid.WithKeyPrefix("hold2"))
		b := newLimiter(t, srv.Client(t), hybrid.WithKeyPrefix("hold2"))
		awaitBans(t, b)
		local(b, "k")
		require.NoError(t, a.Ban(ctx, "k", time.Hour))
		require.Eventually(t, func() bool { return source(b, "k") == outcome.SourceDenyCache }, 5*time.Second,
			time.Millisecond, "the ban reaches b")
		assert.Equal(t, outcome.SourceDenyCache, source(b, "k"), "and stays")
		require.NoError(t, a.Unban(ctx, "k"))
		local(b, "k")
	})

	t.Run("a key banned before its entry exists gets a held entry", func(t *testing.T) {
		lim := newLimiter(t, srv.Client(t), hybrid.WithKeyPrefix("hold3"))
		awaitBans(t, lim)
		require.NoError(t, lim.Ban(ctx, "new", time.Hour))
		for i := 0; i < 3; i++ {
			assert.Equal(t, outcome.SourceDenyCache, source(lim, "new"), "decision %d", i)
		}
		require.NoError(t, lim.Unban(ctx, "new"))
		local(lim, "new")
	})
}

// TestBanRacesDecisions: decisions on a key, and on enough other keys to evict and re-insert its
// entry (a cap of 64 keys), run while the key is banned and unbanned on this node over and over. A
// decision that starts after Ban returned and ends before Unban starts is never admitted, whichever
// entry the key has then (held by Ban, or inserted after it and created held).
func TestBanRacesDecisions(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	lim := newLimiter(t, srv.Client(t), hybrid.WithKeyPrefix("holdrace"), hybrid.WithMaxKeys(64))
	awaitBans(t, lim)
	limit := hybrid.Limit{Rate: 1e6, Burst: 1e6}
	var (
		epoch    atomic.Int64 // odd from Ban's return to Unban's start
		stop     atomic.Bool
		wrong    atomic.Int64
		admitted atomic.Int64
		wg       sync.WaitGroup
	)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				key := "k"
				if i%2 == 1 {
					key = "other:" + strconv.Itoa(g) + ":" + strconv.Itoa(i%512)
				}
				was := epoch.Load()
				d, err := lim.Decide(ctx, key, limit)
				banned := was%2 == 1 && epoch.Load() == was // the whole decision ran under one ban
				if err != nil {
					t.Error(err)
					return
				}
				if key == "k" && d.Allowed {
					admitted.Add(1)
					if banned {
						wrong.Add(1)
					}
				}
			}
		}()
	}
	for round := 0; round < 20; round++ {
		require.NoError(t, lim.Ban(ctx, "k", time.Hour))
		epoch.Add(1)
		time.Sleep(5 * time.Millisecond) // decisions run against the ban
		epoch.Add(1)
		require.NoError(t, lim.Unban(ctx, "k"))
		time.Sleep(5 * time.Millisecond) // and without it
	}
	stop.Store(true)
	wg.Wait()
	assert.Zero(t, wrong.Load(), "decisions on k admitted though they started after Ban returned")
	assert.Positive(t, admitted.Load(), "k was admitted between the bans")
	t.Logf("k admitted %d times; %d evictions", admitted.Load(), lim.Stats().Evictions)
}
