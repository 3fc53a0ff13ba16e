package hybrid

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// RedisLog passes go-redis's own log lines to a [*slog.Logger], at most one line per interval.
// go-redis writes some failures straight to standard error through a process-wide logger of its own
// ("failed to dial" for every dial of a pool while Redis is down, and pool and Pub/Sub errors),
// outside any limiter's logger; the limiters already report those failures through their breakers
// and metrics. Install a RedisLog once per process, where the program sets up its logging:
//
//	redis.SetLogger(hybrid.NewRedisLog(logger, 10*time.Second))
//
// Create it with [NewRedisLog]; it is safe for concurrent use.
type RedisLog struct {
	logger *slog.Logger
	every  time.Duration
	now    func() time.Time

	mu       sync.Mutex // guards n and reported
	n        int64      // lines received since the last one written
	reported time.Time  // when the last line was written; zero before the first
}

// NewRedisLog returns a go-redis logger (for redis.SetLogger) that writes to logger, as warnings,
// the first line it receives and then at most one line per every, each with the number of lines it
// stands for (itself and those dropped since the last one written). An every of 0 writes every line.
// A nil logger discards everything.
func NewRedisLog(logger *slog.Logger, every time.Duration) *RedisLog {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &RedisLog{logger: logger, every: max(every, 0), now: time.Now}
}

// Printf writes one go-redis log line if one is due; it implements go-redis's logging interface.
func (r *RedisLog) Printf(ctx context.Context, format string, v ...any) {
	now := r.now()
	r.mu.Lock()
	r.n++
	if !r.reported.IsZero() && now.Sub(r.reported) < r.every {
		r.mu.Unlock()
		return
	}
	n := r.n
	r.n, r.reported = 0, now
	r.mu.Unlock()
	r.logger.LogAttrs(ctx, slog.LevelWarn, "hybridrate: go-redis: "+fmt.Sprintf(format, v...),
		slog.Int64("lines", n))
}
