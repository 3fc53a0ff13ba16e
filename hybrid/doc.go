// Package hybrid is the public API of hybridrate: a distributed token-bucket rate limiter that decides
// in nanoseconds from local state and still holds one global limit per key across a fleet, with Redis
// as the shared state.
//
//	lim, err := hybrid.New(rdb) // a *redis.Client, a failover client or a *redis.ClusterClient
//	defer lim.Close(ctx)
//	ok, err := lim.Allow(ctx, "user:42", hybrid.Limit{Rate: 200, Burst: 50})
//	if err == nil && !ok { /* 429 */ }
//
//	d, err := lim.Decide(ctx, "user:42", hybrid.Limit{Rate: 200, Burst: 50}) // the whole answer
//	if err == nil && !d.Allowed { /* 429, Retry-After: d.RetryAfter */ }
//
// Allow and AllowN answer yes or no, as x/time/rate's Allow does; Decide and DecideN decide the
// same way and return a [Decision] (the tokens left, the time to retry, who decided). Beyond
// them: Wait and WaitN block until admitted; Reserve, ReserveN and Refund give tokens a request did
// not use back to this node's lease (exactly: Redis never counts them twice); Peek estimates the
// tokens left without taking any; Reset deletes a key's bucket. docs/api.md says how accurate each
// is in a fleet.
//
// # How it decides
//
// Redis holds the global bucket of each key (whatever its limit: see [Limit]), refilled by Redis TIME. A node takes
// tokens from it in advance, as a lease sized to its own demand on the key (over LeaseHorizon,
// within its demand-weighted share of the burst, plus up to a second of the key's demand drawn on
// its coming refill while it is under its rate: WithLeaseAdvance), and
// consumes them locally: no I/O, no allocation,
// no clock read (outcome.SourceLocal). A small overdraft credit (max(1, DriftThreshold·G/A) tokens while
// the bucket G is not empty) covers the moment a lease runs out while its renewal is in flight, and
// a key the node has never seen is admitted from a cold-start credit (WithoutColdStart turns it
// off). A background loop calls Redis only for keys that need it: debt to report, a lease nearly
// spent, or a renewal Redis asked for; a key with lease to spare costs Redis nothing. When the
// bucket is empty, the node denies locally until Redis's answer says its share of the refill is due.
// Decisions go to Redis synchronously (outcome.SourceCentral, exact) only when a node has no lease and no
// credit while Redis's last answer said the bucket had tokens, or with a drift threshold of 0.
//
// # How far it can over-admit
//
// Over any interval T, all nodes together admit at most Burst + Rate·T + E tokens per key and
// limit, with
//
//	E ≤ min(C·H(N) + N + A, C + Rate·LeaseLife) + N·max(1, D·Burst) + N·min(Burst, max(2, D·Burst))
//
// for N nodes, D the drift threshold, H(N) = 1 + 1/2 + … + 1/N, A = Rate·d the refill Redis lends
// ahead with WithLeaseAdvance(d) (one second by default) and C = Burst + A: leases held unused while the
// bucket refills, the overdraft credits and the cold-start credits. It is a worst case; under steady
// load leases are spent within their horizon and little of it is reached (docs/accuracy.md has
// the measurements). The overshoot is debt, not loss: all consumption is charged in Redis (the
// bucket goes negative, down to −C), and the long-run rate is exact. docs/accuracy.md derives the bound and names the tests that check
// it on real Redis. A drift threshold of 0 makes every decision central and E zero.
//
// # When Redis fails
//
// Redis calls have short timeouts and a circuit breaker. While Redis cannot answer, leases are used
// up and then the outcome.FailurePolicy decides — the limit's own (Limit.OnFailure) or, when that is
// outcome.DefaultFailure, the limiter's (WithFailurePolicy): outcome.LocalFallback (the default) enforces this node's
// share of the limit locally, outcome.FailOpen admits, outcome.FailClosed denies. Consumption admitted meanwhile is
// kept (bounded by the local key cap) and applied when Redis returns: nothing consumed is forgotten.
// A Redis slower than the check timeout but faster than the flush timeout is slow, not down:
// synchronous checks that time out are suspended by a breaker of their own (they go to the
// outcome.FailurePolicy), while the background loop keeps renewing leases (docs/operations.md, "Slow
// Redis").
package hybrid
