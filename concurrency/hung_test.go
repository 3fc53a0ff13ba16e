package concurrency_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// TestHungRedisBounded: on a redis-server stopped with SIGSTOP (a hung host: it accepts connections
// and answers nothing), every call that reaches Redis returns within a few times WithTimeout
// whatever the client's options (redistest.ClientSetups), where it used to wait for the client's ReadTimeout
// (forever without one); after SIGCONT Redis decides again.
func TestHungRedisBounded(t *testing.T) {
	redistest.ForEachClientSetup(t, func(t *testing.T, run redistest.ServerRun) {
		srv, rdb := run.Server, run.Client
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
		checkHungCalls(t, lim, "k", held, other, 4*timeout, "on a hung Redis")

		srv.Resume(t)
		requireDecidesAgain(t, lim, "k")
	})
}

// checkHungCalls checks, with Redis (or key's master) hung, that every call reaching it returns
// within bound: InFlight, other's Extend and held's Release fail with ErrUnavailable, and
// TryAcquire, through the breaker's opening and beyond, answers from the failure policy. where ends
// the log lines ("on a hung Redis").
func checkHungCalls(t *testing.T, lim *concurrency.Limiter, key string, held, other *concurrency.Lease, bound time.Duration, where string) {
	t.Helper()
	ctx := context.Background()
	redistest.Timed(t, "InFlight "+where, bound, func() {
		_, err := lim.InFlight(ctx, key)
		assert.ErrorIs(t, err, concurrency.ErrUnavailable)
	})
	redistest.Timed(t, "Extend "+where, bound, func() {
		_, err := other.Extend(ctx, time.Minute)
		assert.ErrorIs(t, err, concurrency.ErrUnavailable)
	})
	redistest.Timed(t, "Release "+where, bound, func() { assert.ErrorIs(t, held.Release(ctx), concurrency.ErrUnavailable) })
	for i := range 8 { // through the breaker's opening and beyond
		redistest.Timed(t, "TryAcquire "+where, bound, func() {
			ls, err := lim.TryAcquire(ctx, key, 10, time.Minute)
			require.NoError(t, err, "attempt %d", i)
			assert.Equal(t, outcome.SourceFallback, ls.Source(), "attempt %d", i)
		})
	}
}

// requireDecidesAgain waits until a lease on key is acquired and released in Redis again.
func requireDecidesAgain(t *testing.T, lim *concurrency.Limiter, key string) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		ls, err := lim.TryAcquire(ctx, key, 10, time.Minute)
		return err == nil && ls.Source() == outcome.SourceCentral && ls.Acquired() && ls.Release(ctx) == nil
	}, 10*time.Second, 20*time.Millisecond, "Redis decides again after SIGCONT")
}

// TestHungClusterBounded: TestHungRedisBounded on a Redis Cluster whose master for the key's slot
// is stopped with SIGSTOP, for cluster clients with go-redis's defaults (ContextTimeoutEnabled
// false, ReadTimeout 5s), with no read timeout at all, and with ContextTimeoutEnabled: every call
// that reaches Redis returns within 10 times WithTimeout (about once it, measured) (it took the client's 5s ReadTimeout, or
// forever, before the limiter used a cluster client of its own), and Close leaves the caller's
// client open.
func TestHungClusterBounded(t *testing.T) {
	redistest.ForEachClusterSetup(t, func(t *testing.T, run redistest.ClusterRun) {
		cl, rdb, name := run.Cluster, run.Client, run.Name
		const timeout = 50 * time.Millisecond
		lim, err := concurrency.New(rdb, concurrency.WithTimeout(timeout))
		require.NoError(t, err)
		ctx := context.Background()
		key := "hung-" + name
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
		// A tenth of the 5s ReadTimeout; room for a loaded machine and -race.
		checkHungCalls(t, lim, key, held, other, 10*timeout, "on a hung master")

		master.Resume(t)
		cl.WaitHealthy(t, 30*time.Second)
		requireDecidesAgain(t, lim, key)
		require.NoError(t, lim.Close(ctx))
		require.NoError(t, rdb.Ping(ctx).Err(), "the caller's client is not closed")
	})
}
