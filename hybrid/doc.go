// Package hybrid is the public API of hybridrate: a distributed token-bucket rate limiter that decides
// in nanoseconds from local state and still holds one global limit per key across a fleet, with Redis
// as the shared state.
//
//	lim, err := hybrid.New(rdb) // a *redis.Client, a failover client or a *redis.ClusterClient
//	defer lim.Close(ctx)
//	d, err := lim.Allow(ctx, "user:42", hybrid.Limit{Rate: 200, Burst: 50})
//	if err == nil && !d.Allowed { /* 429, Retry-After: d.RetryAfter */ }
//
// # How it decides
//
// Redis holds each key's global bucket, refilled by Redis TIME. Every node keeps, per key, the tokens
// it consumed and a local allowance: after each reconcile it may consume about
//
//	(DriftThreshold · max(G, 0) + Rate·SyncInterval) / A
//
// tokens without asking (less while the bucket is in debt; rounded randomly to a whole token), where
// G is the global token count Redis returned and A the number of nodes active on the key: its share
// of the refill the next interval brings, plus its share of a fraction of the bucket. Decisions within the allowance are local (SourceLocal): no I/O, no allocation,
// no clock read. A background loop reconciles consumed tokens every SyncInterval, in one pipeline per
// Redis node, and renews the allowances. When a node's allowance is spent, the next decision for that
// key goes to Redis synchronously (SourceCentral), which is exact — unless Redis's last answer said
// the bucket is empty once the other nodes' shares are counted: then the node denies locally
// (SourceLocal, not allowed) until the next reconcile. Redis denials are cached until their
// retry-after (SourceDenyCache). A key hammering past its limit therefore costs Redis about one
// command per node per sync interval, not one per request.
//
// # How far it can over-admit
//
// Eventual consistency has a price, bounded: over any interval T, all nodes together admit at most
// Burst + Rate·T + E tokens per key, with
//
//	E ≤ (DriftThreshold · Burst + Rate·SyncInterval) · H(N) + N
//
// where H(N) = 1 + 1/2 + … + 1/N for N nodes (H(8) ≈ 2.72). The overshoot is debt, not loss: all
// consumption is written to Redis, the bucket goes negative (down to −Burst), and the long-run rate is
// exact. docs/accuracy.md derives the bound and the test that checks it on real Redis. A drift
// threshold of 0 makes every decision central and E zero.
//
// # When Redis fails
//
// Redis calls have short timeouts and a circuit breaker. While Redis cannot answer, local allowances
// are used up and then the FailurePolicy decides: LocalFallback (the default) enforces this node's
// share of the limit locally, FailOpen admits, FailClosed denies. Consumption admitted meanwhile is
// kept (bounded by the local key cap) and applied when Redis returns: nothing consumed is forgotten.
package hybrid
