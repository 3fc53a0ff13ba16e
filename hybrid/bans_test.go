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

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/lua"
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
	b := newLimiter(t, proxy.Client(t, redistest.NoRetries), hybrid.WithBanRefresh(time.Hour))
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

// Issue 11 item 4: every ban is enforced, however many there are, and a node does not reread the
// whole ban list every refresh.

// banMany bans n keys ("<prefix><i>") for an hour, straight through the ban script in pipelines.
func banMany(t testing.TB, rdb *redis.Client, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	s := redis.NewScript(lua.Ban())
	require.NoError(t, s.Load(ctx, rdb).Err())
	keys := []string{central.BansKey(hybrid.DefaultKeyPrefix), central.BanChangesKey(hybrid.DefaultKeyPrefix)}
	ch := central.BansChannel(hybrid.DefaultKeyPrefix)
	for lo := 0; lo < n; lo += 5000 {
		pipe := rdb.Pipeline()
		for i := lo; i < min(lo+5000, n); i++ {
			s.EvalSha(ctx, pipe, keys, "ban", ch, prefix+strconv.Itoa(i), "3600000")
		}
		_, err := pipe.Exec(ctx)
		require.NoError(t, err)
	}
}

// enforced calls Allow on each key, every millisecond, until it is denied by the deny cache, and
// returns how many calls were admitted before that and the longest time a key took to be denied
// from its first call (a key beyond the local copy is checked once it reaches Redis: its first
// reconcile or take).
func enforced(t *testing.T, lim *hybrid.Limiter, keys []string, within time.Duration) (admitted int, longest time.Duration) {
	t.Helper()
	limit := hybrid.Limit{Rate: 1000, Burst: 1000}
	for _, k := range keys {
		start := time.Now()
		ok := assert.Eventually(t, func() bool {
			d, err := lim.Decide(context.Background(), k, limit)
			require.NoError(t, err)
			if d.Allowed {
				admitted++
			}
			return !d.Allowed && d.Source == outcome.SourceDenyCache
		}, within, time.Millisecond, "ban of %s enforced", k)
		longest = max(longest, time.Since(start))
		if !ok {
			break
		}
	}
	return admitted, longest
}

// TestBansBeyondLocalCapacity: a node that holds at most 100 bans locally still enforces all 300,
// checking in Redis the keys it meets.
func TestBansBeyondLocalCapacity(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	banMany(t, rdb, "cap:", 300)
	lim := newLimiter(t, rdb, hybrid.WithMaxBans(100), hybrid.WithBanRefresh(50*time.Millisecond))
	require.Eventually(t, func() bool { return lim.Stats().BanListSize == 300 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 100, lim.Stats().Bans, "the local copy is full")
	keys := keyNames("cap:", 300)
	admitted, longest := enforced(t, lim, keys, 5*time.Second)
	t.Logf("300 bans, 100 held locally: every ban enforced, each within %v of its key's first call; %d calls admitted before (1 call/ms); stats %+v",
		longest.Round(time.Millisecond), admitted, lim.Stats())
	// How fast (about 50 ms on an idle machine: the key's first reconcile) is a speed figure, not
	// asserted here: a loaded CI machine stalls flushes for seconds. enforced fails if any ban is not
	// enforced within its window.
}

// TestBansAtScale: 200,000 bans. A new node loads them page by page (no single HGETALL), holds 65,536
// locally, enforces a ban beyond those, and then reads only the change log, never the whole list.
func TestBansAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 200,000 bans; run without -short")
	}
	const n = 200_000
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	banMany(t, rdb, "scale:", n)
	t.Logf("%d bans; Redis memory: list %v B, change log %v B", n,
		srv.Do(t, "MEMORY", "USAGE", central.BansKey(hybrid.DefaultKeyPrefix), "SAMPLES", "0"),
		srv.Do(t, "MEMORY", "USAGE", central.BanChangesKey(hybrid.DefaultKeyPrefix), "SAMPLES", "0"))

	// How long the two ways of reading the list take is BenchmarkBanList's to measure.
	srv.ResetStats(t)
	lim := newLimiter(t, rdb, hybrid.WithBanRefresh(100*time.Millisecond))
	require.Eventually(t, func() bool { return lim.Stats().BanListSize == n }, 30*time.Second, 5*time.Millisecond)
	st := srv.CommandStats(t)
	t.Logf("paged load on a new node: %d HSCAN pages, %d HGETALL", st["hscan"], st["hgetall"])
	assert.Zero(t, st["hgetall"], "no single call reads the whole list")
	assert.Equal(t, 65536, lim.Stats().Bans)

	// Keys spread over the whole list: most are not in the local copy.
	var keys []string
	for i := 0; i < n; i += n / 200 {
		keys = append(keys, "scale:"+strconv.Itoa(i))
	}
	admitted, longest := enforced(t, lim, keys, 5*time.Second)
	t.Logf("%d banned keys: every ban enforced, each within %v of its key's first call; %d calls admitted before (1 call/ms)",
		len(keys), longest.Round(time.Millisecond), admitted)
	// How fast (about 50 ms on an idle machine: the key's first reconcile) is a speed figure, not
	// asserted here: a loaded CI machine stalls flushes for seconds. enforced fails if any ban is not
	// enforced within its window.

	// No full reload while the change log reaches back: 20 refreshes read only the log.
	before := srv.CommandStats(t)
	time.Sleep(2 * time.Second)
	after := srv.CommandStats(t)
	t.Logf("in 2s at a 100ms refresh: %d HSCAN (sweep pages of 1,000), %d HGETALL, %d ZRANGEBYSCORE", after["hscan"]-before["hscan"],
		after["hgetall"]-before["hgetall"], after["zrangebyscore"]-before["zrangebyscore"])
	assert.LessOrEqual(t, after["hscan"]-before["hscan"], int64(25), "no rescan of the list: one 1,000-entry sweep page per refresh")
	assert.Equal(t, before["hgetall"], after["hgetall"])
	assert.GreaterOrEqual(t, after["zrangebyscore"]-before["zrangebyscore"], int64(10), "the change log is read every refresh")
}

// BenchmarkBanList compares reading a list of 20,000 bans in one call (central's Bans, one
// HGETALL) with a new node's paged load of it (HSCAN pages, until its ban-list size is complete).
func BenchmarkBanList(b *testing.B) {
	const n = 20_000
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	banMany(b, rdb, "bench:", n)
	b.Run("one-call", func(b *testing.B) {
		cc, err := central.New(central.Config{Client: rdb, Prefix: hybrid.DefaultKeyPrefix, NodeID: "cmp", SyncTimeout: time.Second,
			FlushTimeout: 10 * time.Second, MaxBatch: 1, ActiveWindow: time.Second, PruneAge: time.Second,
			Recount: time.Second, Horizon: time.Second, Breaker: redisx.BreakerConfig{Threshold: 5, Cooldown: time.Second}})
		require.NoError(b, err)
		b.ReportAllocs()
		for b.Loop() {
			all, err := cc.Bans(context.Background())
			if err != nil || len(all) != n {
				b.Fatalf("Bans: %d bans, %v", len(all), err)
			}
		}
	})
	b.Run("paged-load", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			lim, err := hybrid.New(rdb, hybrid.WithBanRefresh(100*time.Millisecond))
			require.NoError(b, err)
			for lim.Stats().BanListSize != n {
				time.Sleep(time.Millisecond)
			}
			require.NoError(b, lim.Close(context.Background()))
		}
	})
}
