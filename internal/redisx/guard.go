package redisx

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// Guard puts a [Breaker] in front of one Redis client and feeds it with the outcome of every call.
// Create it with [NewGuard]; it is safe for concurrent use.
//
// A call goes like this:
//
//	if !g.Allow() {
//		return ErrUnavailable
//	}
//	caller := ctx
//	ctx, cancel := context.WithTimeout(ctx, timeout)
//	defer cancel()
//	res, err := runner.Run(ctx, rdb, script, keys, args...)
//	g.Done(caller, err)
//
// A call with a deadline far shorter than the others' (a synchronous check) goes through
// [Guard.AllowCheck] and [Guard.DoneCheck] instead, with a second breaker of its own.
type Guard struct {
	breaker *Breaker
	cluster *redis.ClusterClient // non-nil when the client is a Cluster client
}

// NewGuard returns a guard of rdb behind breaker.
func NewGuard(breaker *Breaker, rdb redis.UniversalClient) *Guard {
	g := &Guard{breaker: breaker}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		g.cluster = cc
	}
	return g
}

// Breaker returns the guard's breaker.
func (g *Guard) Breaker() *Breaker { return g.breaker }

// Allow reports whether a call may go to Redis now; see [Breaker.Allow]. A true answer must be
// followed by exactly one Done.
func (g *Guard) Allow() bool { return g.breaker.Allow() }

// Done records the outcome of an allowed call. caller is the caller's context, before the call's own
// timeout was added. A nil err is a success; an error of a caller that gave up (caller.Err() is not
// nil) is neither a success nor a failure; a per-key fault ([ClassBadKey]) shows that Redis is up;
// any other error that [IsTransport] is a failure, after which a Cluster client reloads its slot map.
func (g *Guard) Done(caller context.Context, err error) {
	switch {
	case err == nil:
		g.breaker.Success()
	case gaveUp(caller):
		// The caller gave up (cancelled, or its own deadline, shorter than ours, passed): the call
		// says nothing about Redis, neither a failure nor a success.
		g.breaker.Cancel()
	case !IsTransport(err):
		g.breaker.Success() // Redis served the call, with a per-key error (ClassBadKey): it is up
	default: // ClassTransport or ClassRefused: Redis did not serve the call
		g.breaker.Fail(err)
		g.reload(caller)
	}
}

// reload asks a Cluster client to reload its slot map after a call Redis did not serve: go-redis
// reloads it on MOVED, but not when a dead master refuses connections; its periodic reload can take
// a minute (go-redis #3979). The reload is deduplicated and rate-limited inside go-redis.
func (g *Guard) reload(caller context.Context) {
	if g.cluster != nil {
		g.cluster.ReloadState(caller)
	}
}

// AllowCheck is Allow for a call bounded by a deadline of its own far shorter than the other calls'
// (a synchronous check of a few milliseconds, next to background calls of hundreds): checks, the
// breaker of such calls only, must allow it, and then the guard's breaker. A true answer must be
// followed by exactly one DoneCheck with the same checks.
func (g *Guard) AllowCheck(checks *Breaker) bool {
	if !checks.Allow() {
		return false
	}
	if !g.breaker.Allow() {
		checks.Cancel()
		return false
	}
	return true
}

// DoneCheck records the outcome of a call allowed by AllowCheck. A call that timed out
// ([TimedOut]) while its caller was still waiting shows that Redis answers more slowly than the
// call's own short deadline, not that it is down: it is a failure for checks alone, and tells the
// guard's breaker nothing (its probe slot, if the call held it, is released), so that a slow Redis
// does not stop the calls with longer deadlines, which keep the guard's breaker informed (a Cluster
// client still reloads its slot map, as after any call Redis did not serve). Any other outcome goes
// to the guard's breaker as with Done, and to checks as a success when Redis answered (a nil error
// or a per-key fault) or as nothing (a failure the guard's breaker counts, or a caller that gave
// up).
func (g *Guard) DoneCheck(checks *Breaker, caller context.Context, err error) {
	switch {
	case err == nil:
		checks.Success()
	case gaveUp(caller):
		checks.Cancel()
	case TimedOut(err):
		checks.Fail(err)
		g.breaker.Cancel()
		g.reload(caller)
		return
	case !IsTransport(err):
		checks.Success()
	default:
		checks.Cancel()
	}
	g.Done(caller, err)
}

// TimedOut reports whether err is a timeout: a context deadline (the call's, or the pool wait's)
// or a network timeout (a socket deadline, as go-redis sets one from its ReadTimeout or the
// context). Such an error is of ClassTransport.
func TimedOut(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// gaveUp reports whether the caller's context has ended: it was cancelled or its deadline has passed.
// The deadline is compared with the clock too: a socket deadline taken from the context can fire a
// moment before the context's own timer marks it done.
func gaveUp(caller context.Context) bool {
	if caller.Err() != nil {
		return true
	}
	dl, ok := caller.Deadline()
	return ok && !time.Now().Before(dl)
}
