package central

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/internal/redisx"
)

// slotSeeds are limiter keys whose slots are checked against Redis; FuzzSlot starts from them too.
var slotSeeds = []string{
	"user:1", "a", "{", "}", "{}", "}{", "a{b}c", "{tenant}:x", "x{}y", "a}b", "\x00", "a\x00b{\x00}",
	"日本語", "{{a}}", "foo{bar}{zap}", "{user1000}.following", "123456789",
}

// TestCluster runs the client against a real Redis Cluster of 3 masters and 3 replicas: Slot agrees
// with the server's CLUSTER KEYSLOT; the scripts declare every key they touch (issue #4 item 15); and
// after a master dies, the client reaches the slot's new master within seconds instead of dialling
// the dead one until go-redis's periodic reload (item 14).
func TestCluster(t *testing.T) {
	cl := redistest.StartFailoverCluster(t)
	// ContextTimeoutEnabled makes go-redis honour our SyncTimeout and FlushTimeout (see New).
	cc := cl.Client(t, func(o *redis.ClusterOptions) { o.ContextTimeoutEnabled = true })
	ctx := context.Background()
	node := cl.Nodes()[0]

	t.Run("Slot agrees with CLUSTER KEYSLOT", func(t *testing.T) {
		for _, k := range slotSeeds {
			for _, rk := range []string{k, BucketKey("hr", k)} {
				want, ok := node.Do(t, "CLUSTER", "KEYSLOT", rk).(int64)
				require.True(t, ok)
				assert.EqualValues(t, want, redisx.Slot(rk), "%q", rk)
			}
		}
	})

	t.Run("scripts declare every key they touch", func(t *testing.T) {
		// A key in another slot of the same node: Redis can check only what the script declared.
		declared := "{a}x"
		m := cl.MasterFor(t, declared)
		var sameNode string
		for i := 0; sameNode == ""; i++ {
			if k := "{k" + strconv.Itoa(i) + "}"; redisx.Slot(k) != redisx.Slot(declared) && cl.MasterFor(t, k) == m {
				sameNode = k
			}
		}
		touch := "return redis.call('SET', ARGV[1], 'v')"
		// Without script flags, Redis lets a script touch an undeclared key its node happens to serve.
		require.NoError(t, redis.NewScript(touch).Run(ctx, cc, []string{declared}, sameNode).Err())
		// With the "#!lua" header of our scripts, it refuses.
		err := redis.NewScript("#!lua\n"+touch).Run(ctx, cc, []string{declared}, sameNode).Err()
		require.Error(t, err, "a #!lua script touching an undeclared key of another slot")
		assert.Contains(t, err.Error(), "do not hash to the same slot")

		// Our scripts carry the header and run on the cluster: a reconcile of keys spread over every
		// slot range (grouped by slot, one script call per slot) and the ban script.
		c := newTestClient(t, cc, "a")
		require.False(t, c.runner.Legacy())
		ups := make([]Update, 200)
		for i := range ups {
			ups[i] = Update{Key: "decl:" + strconv.Itoa(i), Limit: Limit{Rate: 10, Burst: 100}, Inc: 1, Cum: int64(i % 7), Used: int64(i % 7)}
		}
		out, errs := make([]State, len(ups)), make([]error, len(ups))
		require.NoError(t, c.Reconcile(ctx, ups, out, errs))
		for i := range ups {
			require.NoError(t, errs[i])
			assert.Equal(t, ups[i].Cum, out[i].Charged, ups[i].Key)
		}
		_, err = c.Take(ctx, Update{Key: "decl:0", Limit: Limit{Rate: 10, Burst: 100}, Inc: 1, Cum: 0, Acked: 0, N: 1})
		require.NoError(t, err)
		require.NoError(t, c.Ban(ctx, "decl:banned", time.Minute))
		bans, err := c.Bans(ctx)
		require.NoError(t, err)
		require.Len(t, bans, 1)
		_, _, now, err := c.ScanBans(ctx, "0", 100)
		require.NoError(t, err)
		ch, err := c.BanChangesSince(ctx, BanCursor{Since: now - 60_000}, 100)
		require.NoError(t, err)
		require.Len(t, ch.Events, 1)
		rem, err := c.BannedKeys(ctx, []string{"decl:banned", "decl:other"})
		require.NoError(t, err)
		assert.Positive(t, rem[0])
		assert.Zero(t, rem[1])
		require.NoError(t, c.Unban(ctx, "decl:banned"))
		assert.False(t, c.runner.Legacy(), "the scripts ran with their #!lua header")

		// The eviction policy is read from every master; one unsafe master makes it unsafe.
		p, err := c.EvictionPolicy(ctx)
		require.NoError(t, err)
		assert.Equal(t, "noeviction", p)
		cl.MasterFor(t, "{x}").Do(t, "CONFIG", "SET", "maxmemory-policy", "volatile-ttl")
		p, err = c.EvictionPolicy(ctx)
		require.NoError(t, err)
		assert.Equal(t, "volatile-ttl", p)
		cl.MasterFor(t, "{x}").Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	})

	t.Run("after a master dies, its slots answer again within seconds", func(t *testing.T) {
		cfg := testConfig(cc, "r")
		cfg.SyncTimeout = 200 * time.Millisecond
		c, err := New(cfg)
		require.NoError(t, err)
		const key = "recover:1"
		lim := Limit{Rate: 1000, Burst: 1_000_000}
		_, err = c.Take(ctx, Update{Key: key, Limit: lim, Inc: 1, N: 1})
		require.NoError(t, err)
		old := cl.MasterFor(t, BucketKey("t", key))

		// Takes for the key every 10ms, recording when each succeeded or failed.
		type result struct {
			at  time.Time
			err error
		}
		var mu sync.Mutex
		var results []result
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				_, err := c.Take(ctx, Update{Key: key, Limit: lim, Inc: 1, N: 1})
				mu.Lock()
				results = append(results, result{time.Now(), err})
				mu.Unlock()
			}
		}()
		defer func() { close(stop); wg.Wait() }()

		killed := time.Now()
		old.Kill(t)
		cl.WaitHealthy(t, 20*time.Second)
		healthy := time.Now()
		require.NotSame(t, old, cl.MasterFor(t, BucketKey("t", key)), "a replica took over")
		var recovered time.Time
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, r := range results {
				if r.at.After(killed) && r.err == nil {
					recovered = r.at
					return true
				}
			}
			return false
		}, 15*time.Second, 10*time.Millisecond, "no successful take after the failover")
		// Once recovered, it stays recovered: the dead node is not dialled any more.
		var after, failed int
		var lastErr error
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			after, failed = 0, 0
			for _, r := range results {
				if r.at.After(recovered) {
					after++
					if r.err != nil {
						failed++
						lastErr = r.err
					}
				}
			}
			return after >= 50
		}, 10*time.Second, 10*time.Millisecond)
		mu.Lock()
		var errsDuring int
		for _, r := range results {
			if r.at.After(killed) && r.at.Before(recovered) {
				errsDuring++
			}
		}
		mu.Unlock()
		t.Logf("master killed; new master serving after %v; first successful take %v after the kill, %v after the new master (%d failed or refused takes meanwhile); breaker state %v",
			healthy.Sub(killed).Round(time.Millisecond), recovered.Sub(killed).Round(time.Millisecond),
			recovered.Sub(healthy).Round(time.Millisecond), errsDuring, c.Breaker().State())
		assert.Less(t, recovered.Sub(healthy), 10*time.Second, "recovery within seconds of the new master")
		assert.Zero(t, failed, "after recovery every take succeeds (last error: %v)", lastErr)
	})
}
