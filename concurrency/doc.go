// Package concurrency limits how many requests (or jobs) each key may have in flight at once
// across a fleet: "at most 20 concurrent requests for tenant X". It is exact: Redis holds every
// lease.
//
//	lim, _ := concurrency.New(rdb, concurrency.WithNodes(8))
//	lease, err := lim.TryAcquire(ctx, "tenant-x", 20, 30*time.Second)
//	if err != nil {
//		return err // bad arguments, a closed limiter, or ctx ended
//	}
//	if !lease.Acquired() {
//		return busy(lease.RetryAfter()) // 20 requests of tenant-x are in flight
//	}
//	defer lease.Release(ctx)
//
// # Model
//
// Each key has a Redis sorted set, "<prefix>:v1:c:{<key>}", of lease id → expiry on Redis's clock
// (TIME inside the script; node clocks never matter). One Lua script (lua/concurrency.lua) removes
// the expired leases, then acquires if fewer than limit remain, releases, or extends, atomically. So
// at no instant does a key hold more than limit unexpired leases, whatever the number of nodes and
// callers. A lease has a TTL: a holder that dies (crash, SIGKILL, network partition) without
// releasing gives its slot back once the TTL has passed, and not before. The key itself expires
// with its last lease.
//
// The TTL is the price of crash safety: pick it longer than the work a lease guards. A holder that
// outlives its TTL loses its slot (another caller may take it, and the key is then over its limit
// by one until the holder finishes). Long-running holders call [Lease.Extend] every ttl/3 or so.
// There is no automatic keep-alive: it would need a goroutine (or timer) per lease, and a holder
// that hangs would keep its slot forever, which is what the TTL is there to prevent; the holder
// knows best when it is still making progress.
//
// # Why there is no local-first mode
//
// Package hybrid answers most decisions locally from leases of tokens. For in-flight limits this
// pays far less and costs more:
//   - A token is spent once; a slot comes back. A node that reserved a block of k slots and handed
//     them out locally would hold them while idle, so another node could be refused with the key
//     under its limit: exact in the "never over" sense, but a limit of 20 shared by 8 nodes would
//     then admit far fewer than 20 on a busy node. Giving blocks back when idle brings back the
//     round trips the blocks were meant to save, and a node that dies holds its whole block until
//     the TTL.
//   - The requests being limited are in flight for much longer than a Redis round trip (usually
//     milliseconds to minutes against ~0.1–0.5 ms), so one round trip to acquire and one to release
//     is a small share of each request's cost.
//
// So every TryAcquire, Release and Extend is one round trip to Redis (one EVALSHA), and Acquire is
// repeated TryAcquire calls. docs/concurrency.md gives the measured cost.
//
// # Failures
//
// Every Redis failure goes to the failure policy, never to the caller as an error: an unreachable
// or slow Redis (each call is bounded by [WithTimeout]), one that refuses calls (OOM, READONLY,
// NOAUTH, …), and a key that cannot be used (WRONGTYPE: something else owns the Redis key; only that
// key is affected). A circuit breaker stops calling Redis after 5 failures in a row and probes it
// again after 500ms. The policies ([WithFailurePolicy]):
//   - outcome.LocalFallback (the default): each node admits max(1, limit/nodes) leases per key in a local
//     semaphore with the same TTLs ([WithNodes] says how many nodes share the limits), so the fleet
//     admits at most max(limit, nodes) per key while Redis is away.
//   - outcome.FailOpen: every lease is granted.
//   - outcome.FailClosed: every lease is denied and marked Unavailable ([Lease.Unavailable]), so an HTTP
//     server can answer 503 rather than 429.
//
// Leases granted by a failure policy are not in Redis: when Redis comes back, a key can briefly hold
// its limit in Redis plus the fallback leases still running (at most limit/nodes per node), until
// they are released. A Release that cannot reach Redis leaves its slot to the TTL. An acquire whose
// caller's context ends while the script may have run is released again at once, best effort.
//
// Invalid arguments are errors (ErrInvalidKey, ErrInvalidLimit, ErrInvalidTTL), as are ErrClosed
// and a context that ended; a full key is not an error: see [Lease.Acquired].
//
// # Keys
//
// Keys are 1 to MaxKeyLen bytes of anything, braces and NUL bytes included. They are stored as they
// are (hash them yourself if they are secret). A key's Redis name starts with "<prefix>:v1:c:{",
// which no name of package hybrid (":v6:b:", ":v3:x:") or of the strict algorithms (":v1:{") starts
// with, so no key can reach another structure of the limiter's. The same key must be used with one
// limit: a call counts the key's leases against its own limit.
package concurrency
