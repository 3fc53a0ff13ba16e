// Package redisx is the Redis call plumbing shared by package central (the hybrid limiter's
// protocol) and package strict (the strict algorithms), so that both behave the same way when Redis
// misbehaves:
//
//   - [Breaker], a consecutive-failure circuit breaker that keeps a sick Redis off the request path;
//   - [Class] and [IsTransport], which sort an error into what it means for the breaker and the
//     failure policy, and [NewError] for sentinels that carry their class;
//   - [Script] and [Runner]: EVALSHA with NOSCRIPT recovery (EVAL for one call, load and re-send for
//     a pipeline), and the switch to scripts without their "#!lua" line for servers before Redis 7;
//   - [Guard], which feeds the breaker with the outcome of each call, applying two rules: a call the
//     caller gave up on (its context was cancelled or its own deadline passed) says nothing about
//     Redis, and a call Redis did not serve makes a Cluster client reload its slot map (a failover
//     moved the slots, and go-redis would otherwise wait for its periodic reload); calls with a far
//     shorter deadline than the others (synchronous checks) go through [Guard.AllowCheck] and
//     [Guard.DoneCheck], which count their timeouts in a breaker of their own, so that a Redis slower
//     than their deadline does not stop the other calls;
//   - [Bound], which gives a client whose calls end within a timeout on a hung server even when
//     go-redis would ignore the context's deadline on the socket (used by central, strict and
//     package concurrency);
//   - [ValidPrefix], the rule for a key prefix that comes before a hash tag.
//
// Everything here is safe for concurrent use.
package redisx
