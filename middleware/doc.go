// Package middleware rate-limits net/http servers with a [policy.Enforcer] (any [Checker]): a
// func(http.Handler) http.Handler that works with the standard ServeMux, chi, gorilla/mux and
// anything else built on net/http.
//
//	enf, _ := policy.NewEnforcer(rdb, policy.WithHashKey(secret))
//	rl, _ := policy.NewReloader("policy.yaml", enf)
//	go rl.Run(ctx)
//	mw, _ := middleware.New(enf,
//		middleware.WithAPIKeyHeader("X-API-Key"),
//		middleware.WithTenant(tenantOf),
//		middleware.WithTrustedProxies(middleware.HeaderXForwardedFor, netip.MustParsePrefix("10.0.0.0/8")),
//		middleware.WithMux(mux))
//	http.ListenAndServe(":8080", mw.Handler(mux))
//
// # Keys
//
// The policy's rules count per dimensions, which the middleware reads from each request: api_key (a
// header, "X-API-Key" by default), user, tenant (functions you supply), ip (the client address:
// X-Forwarded-For, Forwarded or X-Real-IP are honoured only when the direct peer is a trusted proxy,
// and walked from the right), route (the pattern the request is routed by, never the raw path),
// method, and dimensions of your own ([WithDimension]). The policy composes them in a fixed order and
// can hash them (policy.WithHashKey), so no raw key, user id or address reaches Redis.
//
// # Answers
//
// A denied request never reaches the next handler: it gets 429 Too Many Requests, Retry-After (whole
// seconds, rounded up) and the body
//
//	{"error":"rate_limit_exceeded","rule":"<rule id>","retry_after_seconds":N}
//
// A request denied only because Redis could not answer and the denying rule fails closed
// (on_failure: fail_closed) gets 503 Service Unavailable instead, so that "limiter unavailable" is
// not mistaken for "over your limit", with Retry-After and
// {"error":"rate_limiter_unavailable","rule":"<rule id>","retry_after_seconds":N}
// ([WithFailClosedStatus], [WithFailClosedRetryAfter]). A local_fallback rule's denial while Redis is
// away stays a 429: it is still a limit, enforced at this node's share.
//
// Every request is charged, HEAD and OPTIONS (CORS preflight) included: a browser that sends a
// preflight before each cross-origin call pays twice. [WithSkipPreflight] lets preflights through
// unconsulted, [WithExemptMethods] whole methods; a rule's match.methods exempts them from that rule
// only.
//
// A request without a key a rule needs (under missing_key: reject) gets 401 (see
// [WithMissingKeyStatus]) and {"error":"missing_rate_limit_key","rule":"<rule id>"}. Both carry only
// rule ids, never internal keys. Admitted and denied requests alike carry X-RateLimit-Limit,
// X-RateLimit-Remaining and X-RateLimit-Reset for the counter closest to its limit, and the
// RateLimit-Policy and RateLimit fields of draft-ietf-httpapi-ratelimit-headers for every enforced
// counter consulted; [WithHeaders] selects which. An admitted request carries the policy's result in
// its context (see [FromContext]) unless [WithoutContextResult] leaves it out, which makes a request
// cheaper.
//
// # Concurrency caps
//
// [WithConcurrency] caps the requests in flight per dimension value across the fleet ("at most 20
// requests of each tenant at once") with a [concurrency.Limiter]: an admitted request takes a lease
// before the next handler and gives it back when the handler returns or panics. A request over the
// cap gets 429, Retry-After: 1 and {"error":"concurrency_limit_exceeded","dimension":"<name>",
// "retry_after_seconds":1}; one refused because Redis is away and the Limiter fails closed gets the
// fail-closed answer above. docs/concurrency.md has the model and its cost (two Redis round trips
// per capped request).
//
// # Load shedding
//
// [WithLoadShedding] sheds requests by priority before any rate limit is consulted, in Stripe's
// model: as utilisation rises, test traffic goes first, then reads, then writes, then critical
// requests; shed requests get 503 and Retry-After.
package middleware
