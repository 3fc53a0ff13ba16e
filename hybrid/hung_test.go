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
		hybrid.WithFailurePolicy(hybrid.FailOpen), hybrid.WithoutColdStart()) // a new key's first decision asks Redis
	ctx := context.Background()
	limit := hybrid.PerSecond(1000)
	_, err := lim.Peek(ctx, "warm", limit) // opens a pooled connection and reaches Redis
	require.NoError(t, err)

	srv.Pause(t)
	timed := func(what string, bound time.Duration, f func()) {
		t.Helper()
		start := time.Now()
		f()
		took := time.Since(start)
		t.Logf("%s on a hung Redis: %v", what, took)
		assert.Less(t, took, bound, "%s on a hung Redis", what)
	}
	for i := range 4 { // keys never seen: each needs Redis
		timed("Allow", 4*check, func() {
			d, err := lim.Allow(ctx, "cold-"+string(rune('a'+i)), limit)
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
