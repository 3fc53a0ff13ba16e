package concurrency_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// TestHungRedisBounded: on a redis-server stopped with SIGSTOP (a hung host: it accepts connections
// and answers nothing), every call that reaches Redis returns within a few times WithTimeout, with
// a client created with go-redis's defaults (ContextTimeoutEnabled false, ReadTimeout 3s), where it
// used to wait for the client's ReadTimeout; after SIGCONT Redis decides again.
func TestHungRedisBounded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t) // go-redis defaults: the deadline of a call is not applied to the socket
	const timeout = 50 * time.Millisecond
	lim, err := concurrency.New(rdb, concurrency.WithTimeout(timeout))
	require.NoError(t, err)
	t.Cleanup(func() { _ = lim.Close(context.Background()) })
	ctx := context.Background()
	held, err := lim.TryAcquire(ctx, "k", 10, time.Minute)
	require.NoError(t, err)
	require.True(t, held.Acquired())
	require.Equal(t, concurrency.SourceRedis, held.Source())
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
			assert.Equal(t, concurrency.SourceLocalFallback, ls.Source(), "attempt %d", i)
		})
	}

	srv.Resume(t)
	require.Eventually(t, func() bool {
		ls, err := lim.TryAcquire(ctx, "k", 10, time.Minute)
		return err == nil && ls.Source() == concurrency.SourceRedis && ls.Acquired() && ls.Release(ctx) == nil
	}, 10*time.Second, 20*time.Millisecond, "Redis decides again after SIGCONT")
}
