// Package strict enforces exact rate limits in Redis: every decision is one atomic Lua script call,
// so the counts are exact whatever the number of processes, at the price of one round trip per
// request. (Package hybrid is the other choice: decisions in memory, reconciled with Redis in the
// background, with a bounded overshoot.)
//
// A [Limiter] needs only a Redis client; [New] takes options for the rest:
//
//	l, err := strict.New(rdb)
//	login := strict.Rule{Name: "login", Algorithm: strict.SlidingLog, Limit: 5, Period: 15 * time.Minute}
//	ok, err := l.Allow(ctx, login, userID)   // yes or no, as x/time/rate's Allow
//	d, err := l.Decide(ctx, login, userID)   // the whole answer: Remaining, RetryAfter, …
//
// Five algorithms count the requests ([TokenBucket], [GCRA], [FixedWindow], [SlidingWindow],
// [SlidingLog]; docs/algorithms.md compares them), all with weighted costs. [Limiter.AllowMulti]
// applies several rules to one request all or nothing, in one call. A [Shaper] is a global leaky
// bucket that delays work instead of denying it.
//
// # Errors
//
// A denial is not an error. An error means no decision was made: the request was invalid (it wraps
// [ErrInvalid] and was never sent), the circuit breaker is open or Redis could not serve the call (it
// wraps [ErrUnavailable]), or Redis refused this key alone. [ErrUnavailable], like [IsTransport],
// tells which errors call for the caller's failure policy. The scripts run on Redis
// TIME, so clock skew between processes does not matter.
package strict
