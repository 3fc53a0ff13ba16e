package hybrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// TestHungRedisBounded: on a redis-server stopped with SIGSTOP (a hung host: it accepts connections
// and answers nothing), with a client created with go-redis's defaults (ContextTimeoutEnabled
// false, ReadTimeout 3s), AllowN waits at most about the check timeout and Peek and Reset at most
// about the flush timeout (their documented bounds), never the client's ReadTimeout; after SIGCONT
// Redis answers again.
func TestHungRedisBounded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t) // go-redis defaults: the deadline of a call is not applied to the socket
	const check, flush = 20 * time.Millisecond, 100 * time.Millisecond
	lim := newLimiter(t, rdb, hybrid.WithCheckTimeout(check), hybrid.WithFlushTimeout(flush),
		hybrid.WithFailurePolicy(outcome.FailOpen), hybrid.WithoutColdStart()) // a new key's first decision asks Redis
	ctx := context.Background()
	limit := hybrid.PerSecond(1000)
	_, err := lim.Peek(ctx, "warm", limit) // opens a pooled connection and reaches Redis
	require.NoError(t, err)

	srv.Pause(t)
	timed := func(what string, bound time.Duration, f func()) {
		t.Helper()
		redistest.Timed(t, what+" on a hung Redis", bound, f)
	}
	for i := range 4 { // keys never seen: each needs Redis
		timed("Allow", 4*check, func() {
			d, err := lim.Decide(ctx, "cold-"+string(rune('a'+i)), limit)
			require.NoError(t, err)
			assert.True(t, d.Allowed)
		})
	}
	timed("Peek", 4*flush, func() {
		_, err := lim.Peek(ctx, "unknown", limit)
		assert.Error(t, err)
	})
	timed("Reset", 4*flush, func() { assert.Error(t, lim.Reset(ctx, "unknown", limit)) })

	srv.Resume(t)
	require.Eventually(t, func() bool {
		_, err := lim.Peek(ctx, "unknown", limit)
		return err == nil && lim.Reset(ctx, "unknown", limit) == nil
	}, 10*time.Second, 20*time.Millisecond, "Redis answers again after SIGCONT")
}

// TestHungClusterBounded: TestHungRedisBounded on a Redis Cluster whose master for the keys' slot is
// stopped with SIGSTOP, for cluster clients with go-redis's defaults (ContextTimeoutEnabled false,
// ReadTimeout 5s), with no read timeout at all, and with ContextTimeoutEnabled: AllowN waits at most
// about the check timeout, Peek and Reset about the flush timeout (it took the client's 5s
// ReadTimeout, or forever, before the limiter used a cluster client of its own), Close returns
// within its context, and the caller's client stays open.
func TestHungClusterBounded(t *testing.T) {
	redistest.ForEachClusterSetup(t, func(t *testing.T, run redistest.ClusterRun) {
		cl, rdb, name := run.Cluster, run.Client, run.Name
		const check, flush = 20 * time.Millisecond, 100 * time.Millisecond
		lim, err := hybrid.New(rdb, hybrid.WithCheckTimeout(check), hybrid.WithFlushTimeout(flush),
			hybrid.WithFailurePolicy(outcome.FailOpen), hybrid.WithoutColdStart())
		require.NoError(t, err)
		ctx := context.Background()
		limit := hybrid.PerSecond(1000)
		warm := "hung-" + name
		require.Eventually(t, func() bool { // opens a pooled connection to the key's master
			_, err := lim.Peek(ctx, warm, limit)
			return err == nil
		}, 10*time.Second, 10*time.Millisecond, "warm-up")
		master := cl.MasterFor(t, "{"+warm+"}") // a key is its bucket's hash tag
		var keys []string                       // keys never seen, on that master
		for i := 0; len(keys) < 6; i++ {
			if k := fmt.Sprintf("%s-%d", warm, i); cl.MasterFor(t, "{"+k+"}") == master {
				keys = append(keys, k)
			}
		}
		master.Pause(t)
		timed := func(what string, bound time.Duration, f func()) {
			t.Helper()
			redistest.Timed(t, what+" on a hung master", bound, f)
		}
		for _, k := range keys[:4] { // each needs Redis
			timed("Allow", 10*check, func() {
				d, err := lim.Decide(ctx, k, limit)
				require.NoError(t, err)
				assert.True(t, d.Allowed)
			})
		}
		timed("Peek", 10*flush, func() {
			_, err := lim.Peek(ctx, keys[4], limit)
			assert.Error(t, err)
		})
		timed("Reset", 10*flush, func() { assert.Error(t, lim.Reset(ctx, keys[5], limit)) })
		timed("Close", 10*flush+time.Second, func() {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_ = lim.Close(cctx) // its final flush fails: the master is still hung
		})

		master.Resume(t)
		cl.WaitHealthy(t, 30*time.Second)
		require.NoError(t, rdb.Ping(ctx).Err(), "the caller's client is not closed")
	})
}
