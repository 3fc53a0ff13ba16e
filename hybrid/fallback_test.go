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

// fallbackGrants calls Allow on key until the outcome.LocalFallback limiter denies it (decisions still
// covered by a lease held from before the outage are skipped) and returns how many it admitted.
func fallbackGrants(t *testing.T, lim *hybrid.Limiter, key string, limit hybrid.Limit) int {
	t.Helper()
	got := 0
	for i := range 1000 {
		d, err := lim.Decide(context.Background(), key, limit)
		require.NoError(t, err)
		if d.Source != outcome.SourceFallback {
			continue
		}
		if !d.Allowed {
			return got
		}
		got++
		require.Less(t, i, 999, "the fallback never denied")
	}
	return got
}

// TestFallbackShareCountsLiveNodes (issue 26): after rolling restarts, Redis still reports every
// process that used a key in the last 10 minutes (eight here, two of them live); outcome.LocalFallback
// divides the limit by the live limiters of the fleet registry instead, so each of the two live
// nodes enforces half the limit, not an eighth of it, both on the key the departed processes used
// (half of what Redis last said its bucket held) and on a key this node never asked Redis about
// (half the burst).
func TestFallbackShareCountsLiveNodes(t *testing.T) {
	t.Parallel()
	t.Cleanup(func() { redistest.AwaitDialRetries(t) }) // registered first: runs after the clients are closed
	srv := redistest.Start(t)
	ctx := context.Background()
	limit := hybrid.Limit{Rate: 1, Burst: 100} // a refill too slow to matter while the test counts
	start := func() *hybrid.Limiter {
		lim, err := hybrid.New(srv.Client(t), hybrid.WithFleetBeat(20*time.Millisecond),
			hybrid.WithCheckTimeout(time.Second), hybrid.WithFailurePolicy(outcome.LocalFallback))
		require.NoError(t, err)
		awaitBans(t, lim)
		_, err = lim.Allow(ctx, "k", limit)
		require.NoError(t, err)
		require.NoError(t, lim.Flush(ctx))
		return lim
	}
	stop := func(lim *hybrid.Limiter) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		require.NoError(t, lim.Close(cctx))
	}
	live := []*hybrid.Limiter{start(), start()}
	for range 3 { // three rolling restarts of both processes: six departed, two live
		for i := range live {
			stop(live[i])
			live[i] = start()
		}
	}
	t.Cleanup(func() {
		for _, l := range live {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			_ = l.Close(cctx)
			cancel()
		}
	})
	for _, l := range live { // one more round each, so that both hold Redis's latest count
		_, err := l.Allow(ctx, "k", limit)
		require.NoError(t, err)
		require.NoError(t, l.Flush(ctx))
	}
	require.Eventually(t, func() bool { return live[0].FleetSize() == 2 && live[1].FleetSize() == 2 },
		10*time.Second, 5*time.Millisecond, "the registry counts the two live limiters")

	srv.Kill(t)
	got := fallbackGrants(t, live[0], "k", limit)
	t.Logf("fallback admitted %d on the key eight processes used, two of them live", got)
	// The fallback starts from this node's share of what Redis last said the bucket held: burst
	// 100 less the restarts' requests and the leases they took, about 92.
	assert.InDelta(t, 45, got, 5, "a half share of the bucket (an eighth would be 12 at most)")
	got = fallbackGrants(t, live[1], "fresh", limit)
	t.Logf("fallback admitted %d on a key Redis never answered about", got)
	assert.InDelta(t, 50, got, 1, "a half share of burst 100 (an eighth would be 12)")
}

// TestWaitUnderLocalFallback (issue 26): with Redis down, WaitN waits for the outcome.LocalFallback
// limiter's next token within its deadline, as it waits for Redis's with Redis up, instead of
// failing at once: the fallback's RetryAfter is the time until its bucket holds n tokens, not the
// time to refill n from empty (500ms here, longer than the deadline).
func TestWaitUnderLocalFallback(t *testing.T) {
	t.Parallel()
	t.Cleanup(func() { redistest.AwaitDialRetries(t) }) // registered first: runs after the clients are closed
	srv := redistest.Start(t)
	ctx := context.Background()
	lim := newLimiter(t, srv.Client(t), hybrid.WithFleetBeat(20*time.Millisecond),
		hybrid.WithFailurePolicy(outcome.LocalFallback), hybrid.WithoutColdStart())
	require.Eventually(t, func() bool { return lim.FleetSize() == 1 }, 10*time.Second, 5*time.Millisecond)
	srv.Kill(t)
	for i := 0; lim.Stats().CheckBreaker == "closed"; i++ { // decisions then go to the fallback with no I/O
		require.Less(t, i, 1000, "the checks' breaker opens")
		_, err := lim.Allow(ctx, fmt.Sprintf("warm-%d", i), hybrid.PerSecond(100))
		require.NoError(t, err)
	}
	limit := hybrid.Limit{Rate: 2, Burst: 1} // one token every 500ms
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 5, "the machine is too slow for this test's timing")
		key := fmt.Sprintf("w-%d", attempt)
		d, err := lim.Decide(ctx, key, limit)
		require.NoError(t, err)
		require.Equal(t, outcome.SourceFallback, d.Source)
		require.True(t, d.Allowed)
		took := time.Now()

		time.Sleep(300 * time.Millisecond) // the next token is about 200ms away
		d, err = lim.Decide(ctx, key, limit)
		require.NoError(t, err)
		if d.Allowed {
			continue // more than 500ms passed: try again
		}
		assert.Less(t, d.RetryAfter, 500*time.Millisecond-time.Since(took)+50*time.Millisecond,
			"the time until the bucket holds a token, not a full refill")
		t.Logf("RetryAfter %v after %v", d.RetryAfter, time.Since(took))

		wctx, cancel := context.WithTimeout(ctx, 450*time.Millisecond)
		start := time.Now()
		err = lim.Wait(wctx, key, limit)
		cancel()
		require.NoError(t, err, "the token comes within the deadline")
		t.Logf("Wait under outcome.LocalFallback took %v", time.Since(start))

		// A deadline shorter than the fallback's next token fails at once, as with Redis up.
		wctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
		start = time.Now()
		err = lim.Wait(wctx, key, limit)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Less(t, time.Since(start), 50*time.Millisecond, "no sleep when the deadline comes first")
		return
	}
}
