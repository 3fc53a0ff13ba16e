package hybrid_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/logtest"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// TestOutageLogsStateChanges is issue 11 item 5: Redis killed for 2s under load at a 1ms sync
// interval costs a handful of log lines (the breaker opened, with its cause; a summary of the
// failed reconciles; the breaker closed), not one line per flush.
func TestOutageLogsStateChanges(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	rec := &logtest.Recorder{}
	// Strict mode (drift 0): every decision asks Redis, so the outage meets the synchronous checks
	// and the breaker at once; the failure policy's admissions are reconciled every millisecond.
	lim := newLimiter(t, rdb, hybrid.WithSyncInterval(time.Millisecond), hybrid.WithLogger(slog.New(rec)),
		hybrid.WithDriftThreshold(0), hybrid.WithCheckTimeout(20*time.Millisecond), hybrid.WithFlushTimeout(50*time.Millisecond))
	keys := keyNames("log:", 32)
	limit := hybrid.Limit{Rate: 1e4, Burst: 1e6}
	for _, k := range keys {
		d, err := lim.Decide(context.Background(), k, limit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	flushed(t, lim, 5*time.Second)
	l := &loader{lim: lim, keys: keys, limit: limit, pace: 100 * time.Microsecond}
	l.start(2)
	defer l.halt()
	time.Sleep(100 * time.Millisecond)
	from := rec.Len()

	srv.Kill(t)
	time.Sleep(2 * time.Second)
	flushesDuring := lim.Stats().Flushes
	srv.Restart(t)
	require.Eventually(t, func() bool { return !lim.Stats().BreakerOpen && lim.Stats().FailedKeys > 0 },
		5*time.Second, 10*time.Millisecond, "the breaker closes once Redis is back")
	time.Sleep(100 * time.Millisecond)

	lines := rec.Lines(from)
	t.Logf("%d log lines during a 2s outage (%d flush rounds so far):\n%s", len(lines), flushesDuring, strings.Join(lines, "\n"))
	assert.LessOrEqual(t, len(lines), 8, "a handful of lines, not one per flush")
	has := func(sub ...string) bool {
		for _, line := range lines {
			ok := true
			for _, s := range sub {
				ok = ok && strings.Contains(line, s)
			}
			if ok {
				return true
			}
		}
		return false
	}
	assert.True(t, has("circuit breaker opened", "class=transport", "last_error="), "the opening, with its cause")
	assert.True(t, has("reconcile failing", "failures="), "a summary of the failed reconciles")
	assert.True(t, has("circuit breaker closed"), "the recovery")
}
