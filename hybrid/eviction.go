package hybrid

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/every"
	"github.com/hybridrate/hybridrate/internal/redisx"
)

// evictionWatch holds what the limiter knows of Redis's maxmemory-policy.
type evictionWatch struct {
	policy atomic.Pointer[string] // the policy last read; nil until one was read
}

// watchEviction reads Redis's maxmemory-policy now and every o.evictionCheck until ctx ends, and logs
// once per change: a warning when the policy can evict the limiter's keys (anything but noeviction;
// see central.EvictionUnsafe), a note when it is safe again. A policy that cannot be read is logged
// once per distinct error, unless Redis is simply unreachable (the breaker's log covers that).
func (l *Limiter) watchEviction(ctx context.Context) {
	var last, lastErr string
	check := func() {
		p, err := l.central.EvictionPolicy(ctx)
		if err != nil {
			if ctx.Err() != nil || redisx.Class(err) == redisx.ClassTransport || err.Error() == lastErr {
				return
			}
			lastErr = err.Error()
			l.opts.logger.LogAttrs(ctx, slog.LevelInfo, "hybridrate: cannot read Redis's maxmemory-policy to check that it is noeviction; "+
				"grant the limiter's user +config|get or +info to let it check", slog.Any("error", err))
			return
		}
		lastErr = ""
		if p == last {
			return
		}
		l.evict.policy.Store(&p)
		switch {
		case central.EvictionUnsafe(p):
			l.opts.logger.LogAttrs(ctx, slog.LevelWarn, "hybridrate: Redis's maxmemory-policy can evict the limiter's keys: when Redis is full, "+
				"buckets reset to full and bans are lifted without notice; set maxmemory-policy noeviction (see docs/operations.md)",
				slog.String("maxmemory_policy", p))
		case last != "":
			l.opts.logger.LogAttrs(ctx, slog.LevelInfo, "hybridrate: Redis's maxmemory-policy is noeviction again", slog.String("maxmemory_policy", p))
		}
		last = p
	}
	check()
	every.Tick(ctx, l.opts.evictionCheck, check)
}

// evictionPolicy returns the policy last read and whether one was.
func (l *Limiter) evictionPolicy() (string, bool) {
	if p := l.evict.policy.Load(); p != nil {
		return *p, true
	}
	return "", false
}
