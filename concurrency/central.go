package concurrency

// This file holds the package's only uses of the shared Redis plumbing (internal/redisx): its error
// classes, its guard (circuit breaker, slot-map reload, caller-deadline rule), its script runner and
// its bound on calls to a hung server.

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/internal/redisx"
)

// bounded returns rdb bounded by timeout (redisx.Bound): rdb itself when go-redis applies a call's
// deadline to the socket (a client created with ContextTimeoutEnabled); otherwise a shallow copy of a
// *redis.Client with socket timeouts of timeout, or a new cluster client with ContextTimeoutEnabled
// built from a cluster client's options, which the Limiter owns (owned is then true: Close closes
// it). Without it, a call to a hung Redis waits for the client's ReadTimeout (3s or 5s by default),
// not for WithTimeout's. A client of another type, which cannot be bounded so, is logged.
func bounded(rdb redis.UniversalClient, timeout time.Duration, log *slog.Logger) (_ redis.UniversalClient, owned bool) {
	b := redisx.Bound(rdb, timeout)
	if !b.Enforced {
		log.Warn("concurrency: this Redis client type is neither a *redis.Client nor a *redis.ClusterClient; " +
			"a hung Redis may hold calls beyond WithTimeout unless it applies context deadlines")
	}
	return b.Client, b.Owned
}

// fault is what a failed Redis call means for the failure policy and the breaker.
type fault uint8

const (
	faultNone     fault = iota
	faultCanceled       // the caller's context ended: nothing is known about Redis
	faultRedis          // Redis did not serve the call (transport, timeout, a refusal): a breaker failure
	faultKey            // Redis served the call but could not apply it to this key (WRONGTYPE, a bad reply)
)

// classify maps an error of a Redis call to its fault.
func classify(err error) fault {
	if errors.Is(err, errBadReply) {
		return faultKey
	}
	switch redisx.Class(err) {
	case redisx.ClassNone:
		return faultNone
	case redisx.ClassCanceled:
		return faultCanceled
	case redisx.ClassBadKey, redisx.ClassInvalid:
		return faultKey
	}
	return faultRedis
}

// newGuard returns the breaker and guard in front of rdb: the breaker defaults every package uses
// (redisx.DefaultBreaker), the Cluster slot-map reload after a failure and the rule that a caller
// that gave up says nothing about Redis, as for package strict.
func newGuard(rdb redis.UniversalClient, log *slog.Logger) *redisx.Guard {
	cfg := redisx.DefaultBreaker()
	cfg.OnStateChange = func(ev redisx.BreakerEvent) { logBreaker(log, ev) }
	return redisx.NewGuard(redisx.NewBreaker(cfg, nil), rdb)
}

// call runs one operation of concurrency.lua on rkey through the guard and the runner (EVALSHA with
// EVAL on NOSCRIPT, the variant without "#!lua" on a server that predates script flags), bounded by
// WithTimeout, and returns its decoded reply and what a failure means ([fault]).
func (l *Limiter) call(ctx context.Context, rkey, op, id string, limit int, ttlMS int64) (reply, fault, error) {
	if !l.guard.Allow() {
		return reply{}, faultRedis, redisx.ErrBreakerOpen
	}
	caller := ctx
	cctx, cancel := context.WithTimeout(ctx, l.o.timeout)
	defer cancel()
	res, err := l.runner.Run(cctx, l.rdb, script, []string{rkey}, op, id, strconv.Itoa(limit), strconv.FormatInt(ttlMS, 10))
	l.guard.Done(caller, err)
	if err == nil {
		var rep reply
		if rep, err = decodeReply(res); err == nil {
			return rep, faultNone, nil
		}
	}
	f := classify(err)
	if f != faultNone && caller.Err() != nil {
		f = faultCanceled
	}
	return reply{}, f, err
}

// logBreaker logs the breaker's state changes that an operator acts on: opened (with the failure that
// opened it) and closed. The open ↔ half-open changes of the probes in between are not logged: an
// outage costs two lines, not one per probe (every breakerCooldown).
func logBreaker(log *slog.Logger, ev redisx.BreakerEvent) {
	switch {
	case ev.From == redisx.BreakerClosed && ev.To == redisx.BreakerOpen:
		log.Warn("concurrency: Redis unavailable, circuit breaker opened; the failure policy decides",
			"consecutive_failures", ev.Failures, "last_error", ev.Err, "class", redisx.Class(ev.Err).String())
	case ev.To == redisx.BreakerClosed:
		log.Info("concurrency: Redis available again, circuit breaker closed")
	}
}

// logInterval is the shortest time between two log lines about failures of one kind.
const logInterval = 10 * time.Second

// logEvery rate-limits the log lines of one kind of failure. The zero logEvery is ready to use; it is
// safe for concurrent use.
type logEvery struct {
	mu   sync.Mutex // guards n and last
	n    int64      // failures since the last line
	last time.Time  // when the last line was written; zero before the first
}

// due counts a failure at now and reports whether a line is due, with the failures it reports (this
// one and those not logged since the last line).
func (e *logEvery) due(now time.Time) (int64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if !e.last.IsZero() && now.Sub(e.last) < logInterval {
		return 0, false
	}
	n := e.n
	e.n, e.last = 0, now
	return n, true
}
