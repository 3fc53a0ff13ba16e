package concurrency_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/internal/logtest"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// TestOutageLogsStateChanges (issue 26): an outage long enough for several breaker probes (one per
// 500ms cooldown) costs two lines, the breaker opening (with its cause) and closing, not a line
// per probe; failed releases are summarised.
func TestOutageLogsStateChanges(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rec := &logtest.Recorder{}
	lim := newLimiter(t, srv, concurrency.WithTimeout(100*time.Millisecond), concurrency.WithLogger(slog.New(rec)))
	ctx := context.Background()
	var held []*concurrency.Lease
	for range 3 {
		ls, err := lim.TryAcquire(ctx, "k", 10, time.Minute)
		require.NoError(t, err)
		require.Equal(t, outcome.SourceCentral, ls.Source())
		held = append(held, ls)
	}

	srv.Kill(t)
	for _, ls := range held { // the first fails on Redis; the others find the breaker closed or open
		_ = ls.Release(ctx)
	}
	probes := 0
	deadline := time.Now().Add(2200 * time.Millisecond) // four cooldowns or so
	for time.Now().Before(deadline) {
		before := lim.Stats().RedisErrors
		ls, err := lim.TryAcquire(ctx, "k", 10, time.Minute)
		require.NoError(t, err)
		if lim.Stats().RedisErrors > before {
			probes++
		}
		if ls.Acquired() {
			require.NoError(t, ls.Release(ctx))
		}
		time.Sleep(10 * time.Millisecond)
	}
	srv.Restart(t)
	require.Eventually(t, func() bool {
		ls, err := lim.TryAcquire(ctx, "k", 10, time.Minute)
		return err == nil && ls.Source() == outcome.SourceCentral && ls.Release(ctx) == nil
	}, 10*time.Second, 20*time.Millisecond)

	lines := rec.Lines(0)
	t.Logf("%d calls reached the dead Redis; %d log lines:\n%s", probes, len(lines), strings.Join(lines, "\n"))
	// The releases and the first two tries open the breaker; each call after that is a probe.
	require.GreaterOrEqual(t, probes, 4, "the breaker probed several times")
	count := func(sub string) int {
		n := 0
		for _, l := range lines {
			if strings.Contains(l, sub) {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 1, count("circuit breaker opened"))
	assert.Equal(t, 1, count("circuit breaker closed"))
	assert.Equal(t, 1, count("release failed"), "one summary line within 10s")
	assert.LessOrEqual(t, len(lines), 3)
}
