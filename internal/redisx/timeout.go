package redisx

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// Bounded is a Redis client whose calls end within a timeout even on a hung server (one that
// accepts connections and answers nothing). Create it with [Bound].
type Bounded struct {
	// Client is the client to send the calls on: the caller's client itself, or a shallow copy of it
	// with socket timeouts of the timeout.
	Client redis.UniversalClient
	// Enforced reports whether a call on Client is abandoned once its context's deadline (no later
	// than the timeout) passes. It is false only for a cluster client created without
	// ContextTimeoutEnabled, whose calls wait up to its own ReadTimeout.
	Enforced bool
	// HooksBypassed reports whether Client is a copy that skips the hooks added to the caller's
	// client with AddHook (tracing, metrics): go-redis does not copy hooks.
	HooksBypassed bool
}

// Bound returns rdb bounded by timeout. go-redis applies a context's deadline to the socket only
// when the client was created with ContextTimeoutEnabled; otherwise a call on a hung server waits
// for the client's ReadTimeout (3s by default, often more), whatever the context says. A
// *redis.Client (a Sentinel failover client too) created without it is replaced by a shallow copy,
// sharing its connection pool, whose read and write timeouts are timeout. A client created with
// ContextTimeoutEnabled is returned as is, hooks and all; so is a cluster client, which go-redis
// cannot copy that way (Enforced is then its ContextTimeoutEnabled).
func Bound(rdb redis.UniversalClient, timeout time.Duration) Bounded {
	switch rc := rdb.(type) {
	case *redis.Client:
		if rc.Options().ContextTimeoutEnabled {
			return Bounded{Client: rdb, Enforced: true}
		}
		return Bounded{Client: rc.WithTimeout(timeout), Enforced: true, HooksBypassed: true}
	case *redis.ClusterClient:
		return Bounded{Client: rdb, Enforced: rc.Options().ContextTimeoutEnabled}
	}
	return Bounded{Client: rdb}
}
