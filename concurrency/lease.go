package concurrency

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/outcome"
)

// Lease is the answer to [Limiter.TryAcquire] or [Limiter.Acquire]: when [Lease.Acquired] reports
// true, a slot of its key held until [Lease.Release] or until its TTL passes. A Lease that was not
// acquired says why in its other methods, and releasing it does nothing; so does the zero Lease. Its
// methods are safe for concurrent use.
type Lease struct {
	l          *Limiter
	key        string
	id         string // the lease's member in Redis: the Limiter's tag and num
	num        uint64 // the lease's number in this Limiter, its id in the local semaphore
	acquired   bool
	source     outcome.Source
	fallback   outcome.FailurePolicy // the policy that decided under outcome.SourceFallback
	inFlight   int
	retryAfter time.Duration
	released   atomic.Bool
}

// Acquired reports whether the lease holds a slot. It does no I/O.
func (ls *Lease) Acquired() bool { return ls.acquired }

// Key returns the key the lease was asked for. It does no I/O.
func (ls *Lease) Key() string { return ls.key }

// Source returns who decided: outcome.SourceCentral normally, or outcome.SourceFallback when the failure policy did
// while Redis could not.
func (ls *Lease) Source() outcome.Source { return ls.source }

// Unavailable reports a lease denied only because Redis could not decide and the failure policy is
// outcome.FailClosed: it says nothing about the key's slots (an HTTP server answers 503, not 429).
func (ls *Lease) Unavailable() bool {
	return ls.source == outcome.SourceFallback && ls.fallback == outcome.FailClosed
}

// InFlight returns the number of leases the key held just after the decision, this one included if
// acquired: in Redis, or in the local semaphore under outcome.LocalFallback (0 under outcome.FailOpen and
// outcome.FailClosed).
func (ls *Lease) InFlight() int { return ls.inFlight }

// RetryAfter returns, for a lease that was not acquired, an upper bound on the wait for a slot: the
// time until the earliest lease of the key expires (holders usually release sooner), or the circuit
// breaker's cooldown when [Lease.Unavailable]. It is 0 for an acquired lease. It does no I/O.
func (ls *Lease) RetryAfter() time.Duration { return ls.retryAfter }

// Release gives the lease's slot back. It is idempotent: only the first call on an acquired lease
// does anything, and releasing a lease that was not acquired, or whose TTL has passed, is harmless.
// ctx's values are kept but its cancellation is not (a request's context is often cancelled by the
// time its handler's deferred Release runs); the call is bounded by the Limiter's timeout. If Redis
// cannot be reached the slot comes back when the lease expires, and the error wraps ErrUnavailable;
// callers usually ignore it (the Limiter counts and logs it).
func (ls *Lease) Release(ctx context.Context) error {
	if !ls.acquired || !ls.released.CompareAndSwap(false, true) {
		return nil
	}
	l := ls.l
	switch {
	case ls.source == outcome.SourceCentral:
		rkey, ok := l.untrack(ls)
		if !ok { // Close released it, or it expired long ago
			return nil
		}
		return l.releaseRedis(context.WithoutCancel(ctx), rkey, ls.id)
	case ls.fallback == outcome.LocalFallback:
		l.fb.release(ls.key, ls.num, l.o.now())
	}
	return nil
}

// Extend keeps a long-running holder's slot: it sets the lease to expire ttl from now (on Redis's
// clock) and reports true if the lease was still held, or false if it had expired or been released
// (it is not re-created: its slot may be someone else's now). Call it well before the TTL runs out,
// say every ttl/3; the Limiter never extends leases by itself. Leases granted by a failure policy
// are extended locally. The error is non-nil for an invalid ttl (ErrInvalidTTL), ctx's error, or
// one wrapping ErrUnavailable when Redis could not answer; the lease may then still be held.
func (ls *Lease) Extend(ctx context.Context, ttl time.Duration) (bool, error) {
	if err := validTTL(ttl); err != nil {
		return false, err
	}
	if !ls.acquired || ls.released.Load() {
		return false, nil
	}
	l := ls.l
	if ls.source == outcome.SourceFallback {
		if ls.fallback == outcome.LocalFallback {
			return l.fb.extend(ls.key, ls.num, ttl, l.o.now()), nil
		}
		return true, nil // outcome.FailOpen: nothing holds the slot
	}
	start := l.o.now()
	rep, f, err := l.call(ctx, redisKey(l.o.prefix, ls.key), opExtend, ls.id, 0, ttlMS(ttl))
	if errors.Is(err, redisx.ErrBreakerOpen) {
		return false, fmt.Errorf("concurrency: extend: %w", err)
	}
	switch f {
	case faultNone:
		if rep.ok {
			l.extended(ls, start.Add(ttl))
		}
		return rep.ok, nil
	case faultCanceled:
		return false, ctx.Err()
	}
	l.stats.RedisErrors.Add(1)
	return false, fmt.Errorf("%w: extend: %w", ErrUnavailable, err)
}
