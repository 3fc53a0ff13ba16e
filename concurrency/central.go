package concurrency

// This file holds the package's only uses of the shared Redis plumbing (internal/redisx): its error
// classes, its circuit breaker and its bound on calls to a hung server.

import (
	"errors"
	"log/slog"
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

// breaker guards Redis with the shared consecutive-failure breaker.
type breaker struct{ b *redisx.Breaker }

func newBreaker(log *slog.Logger) breaker {
	return breaker{redisx.NewBreaker(redisx.BreakerConfig{
		Threshold: breakerThreshold, Cooldown: breakerCooldown, MinSpan: breakerMinSpan,
		OnStateChange: func(ev redisx.BreakerEvent) { logBreaker(log, ev) },
	}, nil)}
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

// allow reports whether a call may go to Redis now; a true answer must be followed by one done.
func (b breaker) allow() bool { return b.b.Allow() }

// done records the outcome of an allowed call, whose fault is f.
func (b breaker) done(f fault, err error) {
	switch f {
	case faultRedis:
		b.b.Fail(err)
	case faultCanceled:
		b.b.Cancel()
	default:
		b.b.Success()
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
