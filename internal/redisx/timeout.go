package redisx

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// Bounded is a Redis client whose calls end within a timeout even on a hung server (one that
// accepts connections and answers nothing). Create it with [Bound]; call Close when done with it.
type Bounded struct {
	// Client is the client to send the calls on: the caller's client itself, a shallow copy of it
	// with socket timeouts of the timeout, or a new cluster client built from its options.
	Client redis.UniversalClient
	// Enforced reports whether a call on Client is abandoned once its context's deadline (no later
	// than the timeout) passes. It is false only for a client type Bound does not know (neither a
	// *redis.Client nor a *redis.ClusterClient).
	Enforced bool
	// HooksBypassed reports whether Client skips the hooks added to the caller's client with AddHook
	// (tracing, metrics): go-redis copies no hooks, neither to a shallow copy nor to a new client.
	HooksBypassed bool
	// Owned reports whether Client is a new client, with connection pools of its own, that Bound
	// created: Close closes it.
	Owned bool
}

// Close closes Client if Bound created it (Owned), and does nothing otherwise: the caller's own
// client is never closed.
func (b Bounded) Close() error {
	if !b.Owned || b.Client == nil {
		return nil
	}
	return b.Client.Close()
}

// Bound returns rdb bounded by timeout, the longest deadline its user gives a call. go-redis
// applies a context's deadline to the socket only when the client was created with
// ContextTimeoutEnabled; otherwise a call on a hung server waits for the client's ReadTimeout (3s
// by default for a *redis.Client, 5s for a cluster client, forever with -1), whatever the context
// says. A client created with ContextTimeoutEnabled is returned as is, hooks and all. Otherwise:
//
//   - a *redis.Client (a Sentinel failover client too) is replaced by a shallow copy, sharing its
//     connection pool, whose read and write timeouts are timeout;
//   - a *redis.ClusterClient, which go-redis cannot copy that way, is replaced by a new cluster
//     client built from a copy of its options with ContextTimeoutEnabled set (every call then ends at
//     its own context's deadline, however short) and read and write timeouts of timeout (which bound
//     the calls go-redis makes without a deadline, such as its slot map reloads). Everything else
//     in the options is kept (addresses, credentials, TLS, MaxRedirects, pool sizes, NewClient,
//     ClusterSlots), but the new client has connection pools and a slot map of its own (it opens
//     connections as calls need them, and MinIdleConns of them per node if that option is set), and
//     it has none of the hooks or OnNewNode callbacks added to rdb. Owned is then true: the caller
//     closes it with [Bounded.Close].
func Bound(rdb redis.UniversalClient, timeout time.Duration) Bounded {
	switch rc := rdb.(type) {
	case *redis.Client:
		if rc.Options().ContextTimeoutEnabled {
			return Bounded{Client: rdb, Enforced: true}
		}
		return Bounded{Client: rc.WithTimeout(timeout), Enforced: true, HooksBypassed: true}
	case *redis.ClusterClient:
		if rc.Options().ContextTimeoutEnabled {
			return Bounded{Client: rdb, Enforced: true}
		}
		return Bounded{Client: redis.NewClusterClient(boundedClusterOptions(rc.Options(), timeout)),
			Enforced: true, HooksBypassed: true, Owned: true}
	}
	return Bounded{Client: rdb}
}

// boundedClusterOptions returns a copy of opt, the options of a running cluster client, for a new
// client bounded by timeout. go-redis normalized opt when it created that client, and normalizes
// the copy again; the values it maps -1 ("none") to 0 would come back as its defaults, so they are
// set back to -1: MaxRedirects (0 means 3 again, so a client that asked for no retries would get
// three), and the retry back-offs.
func boundedClusterOptions(opt *redis.ClusterOptions, timeout time.Duration) *redis.ClusterOptions {
	o := *opt
	o.ContextTimeoutEnabled = true
	o.ReadTimeout, o.WriteTimeout = timeout, timeout
	if o.MaxRedirects == 0 {
		o.MaxRedirects = -1
	}
	if o.MinRetryBackoff == 0 {
		o.MinRetryBackoff = -1
	}
	if o.MaxRetryBackoff == 0 {
		o.MaxRetryBackoff = -1
	}
	return &o
}
