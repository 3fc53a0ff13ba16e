package redisx

import (
	"context"
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
		if g.cluster != nil {
			// go-redis reloads the slot map on MOVED, but not when a dead master refuses connections;
			// its periodic reload can take a minute (go-redis #3979). Ask for one now; it is
			// deduplicated and rate-limited inside go-redis.
			g.cluster.ReloadState(caller)
		}
	}
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
