// Package policy turns rate-limit rules into decisions: which limits apply to a request, per what
// (API key, user, client address, tenant, route...), under which algorithm, at what cost, what
// happens when Redis is away, and which rules only watch (shadow mode).
//
//	p, err := policy.LoadFile("policy.yaml") // or build a *policy.Policy in Go
//	enf, err := policy.NewEnforcer(rdb, policy.WithHashKey(secret))
//	err = enf.SetPolicy(p)
//	res, err := enf.Check(ctx, &policy.Request{Method: "GET", Tier: "pro",
//		Dims: policy.Values{"api_key": key, "tenant": "acme"}})
//	if err == nil && !res.Allowed { /* 429: res.Rule, res.RetryAfter */ }
//
// Package middleware does the HTTP side: it extracts the dimensions from requests, calls Check, and
// writes 429 responses and rate-limit headers. A [Reloader] keeps an Enforcer's policy in step with a
// file. docs/policies.md describes the file format and how to choose rules.
//
// # Rules and algorithms
//
// A rule is either hybrid (package hybrid's local-first token bucket: nanosecond decisions, one
// global limit with a bounded overshoot) or strict (one of package central's exact algorithms: token
// bucket, GCRA, fixed window, sliding window counter, sliding log — one Redis round trip per request
// for all of its strict rules together).
//
// # Hierarchy
//
// Every enforced rule that matches a request applies, global, per-tenant and per-endpoint rules
// alike: the request passes only if all of them pass. Check consults them in this order and stops at
// the first denial:
//
//  1. the memo: a counter that denied this subject, until its retry-after, denies again at once;
//     nothing is consulted or consumed;
//  2. the hybrid rules, those with the most dimensions (the narrowest) first, then in file order:
//     each one that admits has taken the request's cost;
//  3. all the strict rules in one atomic script: every one counts the request, or none does.
//
// So a denial by a strict rule consumes nothing from any strict rule, and a denial by a hybrid rule
// consumes nothing from the strict rules or from the hybrid rules after it. The hybrid rules consulted
// before the denying rule give the cost they took back (hybrid.Limiter.Refund), so no rule keeps a
// charge for a request that was not admitted; what cannot be given back is counted in
// Stats.Unrefunded. docs/policies.md ("Hierarchy") has the details.
//
// # Shadow mode
//
// A rule in shadow mode is consulted on its own after the enforced rules admitted the request, and
// counts as if enforced; its denials are reported (WithOnShadowDeny, Stats.ShadowDenied) and never
// deny. A policy in shadow mode evaluates its enforced rules as usual, reports their denials and
// admits every request.
package policy
