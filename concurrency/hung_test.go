package concurrency_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// TestHungRedisBounded: on a redis-server stopped with SIGSTOP (a hung host: it accepts connections
// and answers nothing), every call that reaches Redis returns within a few times WithTimeout
// whatever the client's options (hungClients), where it used to wait for the client's ReadTimeout
// (forever without one); after SIGCONT Redis decides again.
func TestHungRedisBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range hungClients {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			rdb := srv.Client(t, tc.opt)
			const timeout = 50 * time.Millisecond
			lim, err := concurrency.New(rdb, concurrency.WithTimeout(timeout))
			require.NoError(t, err)
			t.Cleanup(func() { _ = lim.Close(context.Background()) })
			ctx := context.Background()
			held, err := lim.TryAcquire(ctx, "k", 10, time.Minute)
			require.NoError(t, err)
			require.True(t, held.Acquired())
			require.Equal(t, outcome.SourceCentral, held.Source())
			other, err := lim.TryAcquire(ctx, "k", 10, time.Minute)
			require.NoError(t, err)
			require.True(t, other.Acquired())

			srv.Pause(t)
			const bound = 4 * timeout
			timed := func(what string, f func()) {
				t.Helper()
				start := time.Now()
				f()
				took := time.Since(start)
				t.Logf("%s on a hung Redis: %v", what, took)
				assert.Less(t, took, bound, "%s on a hung Redis", what)
			}
			timed("InFlight", func() {
				_, err := lim.InFlight(ctx, "k")
				assert.ErrorIs(t, err, concurrency.ErrUnavailable)
			})
			timed("Extend", func() {
				_, err := other.Extend(ctx, time.Minute)
				assert.ErrorIs(t, err, concurrency.ErrUnavailable)
			})
			timed("Release", func() { assert.ErrorIs(t, held.Release(ctx), concurrency.ErrUnavailable) })
			for i := range 8 { // through the breaker's opening and beyond
				timed("TryAcquire", func() {
					ls, err := lim.TryAcquire(ctx, "k", 10, time.Minute)
					require.NoError(t, err, "attempt %d", i)
					assert.Equal(t, outcome.SourceFallback, ls.Source(), "attempt %d", i)
				})
			}

			srv.Resume(t)
			require.Eventually(t, func() bool {
				ls, err := lim.TryAcquire(ctx, "k", 10, time.Minute)
				return err == nil && ls.Source() == outcome.SourceCentral && ls.Acquired() && ls.Release(ctx) == nil
			}, 10*time.Second, 20*time.Millisecond, "Redis decides again after SIGCONT")
		})
	}
}

// hungClients are the client options TestHungRedisBounded runs with: go-redis's defaults
// (ContextTimeoutEnabled false: a call's deadline is not applied to the socket, ReadTimeout 3s), no
// read timeout at all (a call would wait forever), and ContextTimeoutEnabled.
var hungClients = []struct {
	name string
	opt  func(*redis.Options)
}{
	{"defaults", func(*redis.Options) {}},
	{"no read timeout", func(o *redis.Options) { o.ReadTimeout = -1 }},
	{"context timeouts", func(o *redis.Options) { o.ContextTimeoutEnabled = true }},
}

// TestHungClusterBounded: TestHungRedisBounded on a Redis Cluster whose master for the key's slot
// is stopped with SIGSTOP, for cluster clients with go-redis's defaults (ContextTimeoutEnabled
// false, ReadTimeout 5s), with no read timeout at all, and with ContextTimeoutEnabled: every call
// that reaches Redis returns within 10 times WithTimeout (about once it, measured) (it took the client's 5s ReadTimeout, or
// forever, before the limiter used a cluster client of its own), and Close leaves the caller's
// client open.
func TestHungClusterBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	cl := redistest.StartCluster(t, 3, 0)
	for _, tc := range redistest.ClusterClientSetups {
		t.Run(tc.Name, func(t *testing.T) { // one at a time: they share the cluster
			rdb := cl.Client(t, tc.Opt)
			const timeout = 50 * time.Millisecond
			lim, err := concurrency.New(rdb, concurrency.WithTimeout(timeout))
			require.NoError(t, err)
			ctx := context.Background()
			key := "hung-" + tc.Name
			var held *concurrency.Lease
			require.Eventually(t, func() bool { // the first calls load the slot map and the script
				ls, err := lim.TryAcquire(ctx, key, 10, time.Minute)
				if err != nil || !ls.Acquired() || ls.Source() != outcome.SourceCentral {
					return false
				}
				held = ls
				return true
			}, 10*time.Second, 10*time.Millisecond, "warm-up")
			other, err := lim.TryAcquire(ctx, key, 10, time.Minute)
			require.NoError(t, err)
			require.True(t, other.Acquired())
			require.Equal(t, outcome.SourceCentral, other.Source())

			master := cl.MasterFor(t, "{"+key+"}")
			master.Pause(t)
			const bound = 10 * timeout // a tenth of the 5s ReadTimeout; room for a loaded machine and -race
			timed := func(what string, f func()) {
				t.Helper()
				start := time.Now()
				f()
				took := time.Since(start)
				t.Logf("%s on a hung master: %v", what, took)
				assert.Less(t, took, bound, "%s on a hung master", what)
			}
			timed("InFlight", func() {
				_, err := lim.InFlight(ctx, key)
				assert.ErrorIs(t, err, concurrency.ErrUnavailable)
			})
			timed("Extend", func() {
				_, err := other.Extend(ctx, time.Minute)
				assert.ErrorIs(t, err, concurrency.ErrUnavailable)
			})
			timed("Release", func() { assert.ErrorIs(t, held.Release(ctx), concurrency.ErrUnavailable) })
			for i := range 8 { // through the breaker's opening and beyond
				timed("TryAcquire", func() {
					ls, err := lim.TryAcquire(ctx, key, 10, time.Minute)
					require.NoError(t, err, "attempt %d", i)
					assert.Equal(t, outcome.SourceFallback, ls.Source(), "attempt %d", i)
				})
			}

			master.Resume(t)
			cl.WaitHealthy(t, 30*time.Second)
			require.Eventually(t, func() bool {
				ls, err := lim.TryAcquire(ctx, key, 10, time.Minute)
				return err == nil && ls.Source() == outcome.SourceCentral && ls.Acquired() && ls.Release(ctx) == nil
			}, 10*time.Second, 20*time.Millisecond, "Redis decides again after SIGCONT")
			require.NoError(t, lim.Close(ctx))
			require.NoError(t, rdb.Ping(ctx).Err(), "the caller's client is not closed")
		})
	}
}
