package hybrid_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
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

// TestRedisLogRateLimits: a RedisLog writes the first line, then at most one per interval, each
// counting the lines it stands for.
func TestRedisLogRateLimits(t *testing.T) {
	t.Parallel()
	rec := &logtest.Recorder{}
	rl := hybrid.NewRedisLog(slog.New(rec), 10*time.Second)
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	now := t0
	rl.SetClock(func() time.Time { return now })
	for i, step := range []struct {
		at      time.Duration
		written string // the line written, or ""
	}{
		{0, "WARN hybridrate: go-redis: line 0 lines=1"},
		{time.Second, ""},
		{5 * time.Second, ""},
		{10 * time.Second, "WARN hybridrate: go-redis: line 3 lines=3"},
		{19 * time.Second, ""},
		{25 * time.Second, "WARN hybridrate: go-redis: line 5 lines=2"},
	} {
		now = t0.Add(step.at)
		before := rec.Len()
		rl.Printf(context.Background(), "line %d", i)
		lines := rec.Lines(before)
		if step.written == "" {
			assert.Empty(t, lines, "step %d", i)
		} else {
			assert.Equal(t, []string{step.written}, lines, "step %d", i)
		}
	}
}

// stderrLog is go-redis's default logger, restored after a test that replaced it.
type stderrLog struct{ l *log.Logger }

func (s stderrLog) Printf(_ context.Context, format string, v ...any) {
	_ = s.l.Output(2, fmt.Sprintf(format, v...))
}

// TestRedisLogRoutesGoRedisLines (issue 26): installed with redis.SetLogger, a RedisLog receives
// go-redis's "failed to dial" lines of a client whose Redis is down, and writes one line for many.
// Not parallel: go-redis's logger is process-wide.
func TestRedisLogRoutesGoRedisLines(t *testing.T) {
	t.Cleanup(func() { redistest.AwaitDialRetries(t) }) // registered first: runs after the clients are closed
	srv := redistest.Start(t)
	srv.Kill(t) // a port nothing listens on
	rec := &logtest.Recorder{}
	redis.SetLogger(hybrid.NewRedisLog(slog.New(rec), time.Hour))
	t.Cleanup(func() { redis.SetLogger(stderrLog{log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)}) })
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	for range 4 {
		require.Error(t, rdb.Ping(context.Background()).Err())
	}
	lines := rec.Lines(0)
	t.Logf("%d line(s) for 4 failed dials: %s", len(lines), strings.Join(lines, "\n"))
	require.Len(t, lines, 1, "one line for the whole burst")
	assert.Contains(t, lines[0], "hybridrate: go-redis:")
	assert.Contains(t, lines[0], "dial")
}
