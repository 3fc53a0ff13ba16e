// Package sidecar serves a policy's decisions to processes that are not written in Go: Envoy's
// rate-limit service (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, over gRPC) and
// the same request and answer as JSON over HTTP. Command hybridrated runs it.
//
//	srv, _ := sidecar.New(obs) // an *observe.Observer or a *policy.Enforcer
//	gs := grpc.NewServer()
//	srv.Register(gs)
//	mux.Handle("POST /v1/check", srv.CheckHandler())
//
// # Descriptors
//
// Each descriptor of a RateLimitRequest is one policy check, as envoyproxy/ratelimit matches each
// descriptor on its own. Its entries are the request's dimensions: an entry's key names a
// dimension (api_key, user, ip, tenant, route, method, or one declared in policy.WithDimensions),
// "remote_address" (what Envoy's remote_address action sends) is the ip, and "tier" sets the
// request's tier; WithKeys renames others. The request's domain is the "domain" dimension. A
// rule counts a descriptor that carries all of its dimensions; give the sidecar's rules
// missing_key: skip (or set it for the whole policy) so that a descriptor lacking a rule's
// dimensions is left out of that rule rather than rejected. A rule without dimensions counts every
// descriptor.
//
// The request's cost is hits_addend (the descriptor's, else the request's, where 0 means 1), as
// Envoy specifies, under every rule that sets no cost of its own (policy.Request.Cost); a
// descriptor's hits_addend of 0 checks without charging (policy.Request.CheckOnly). The request's
// domain namespaces the counters (policy.Request.Domain): a key has separate counters in each
// domain.
//
// # Answers
//
// A descriptor is OVER_LIMIT when the policy denies it (a missing key under missing_key: reject
// included) and OK otherwise; the overall code is OVER_LIMIT when any descriptor is. Each status
// carries the limit, the remaining units and the time to reset of its counter closest to the limit
// (policy.Result.Primary); the response adds X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset for the most constrained descriptor, with the values package middleware sends
// for the same result, and Retry-After when over the limit. Errors map to statuses as
// policy.ErrorStatus says, the middleware's mapping too: a bad request is InvalidArgument (400 over
// HTTP), a caller that gave up Canceled (499); when no decision can be made (Redis failing under a
// rule without a failure policy that answers, say), the call fails with gRPC status Unavailable (503
// over HTTP); Envoy's failure_mode_deny decides what the proxy does then.
//
// # Upstream's configuration
//
// With WithUpstream, the Server answers as envoyproxy/ratelimit does, from upstream's own
// configuration files (policy.ParseUpstream, policy.NewUpstreamConfig), whose Policy the Checker
// enforces: each descriptor's limit is the one the descriptor tree names (policy.UpstreamConfig's
// Lookup, upstream's GetLimit); a limit named in the replaces of another limit of the request is
// dropped; an unlimited one answers OK with limit_remaining 4294967295; a descriptor no limit
// matches, or of an unknown domain, answers OK with no current_limit. The others are checked under
// their rule and answer with the configured limit (name, requests_per_unit, unit), the remaining
// count (0 when over) and duration_until_reset in whole seconds to the end of the epoch-aligned
// window; a shadow_mode limit never denies. An empty domain or no descriptors is InvalidArgument.
// The RateLimit-* headers come only with WithUpstreamHeaders, and WithUpstreamShadow makes the
// overall code OK. docs/sidecar.md lists what still differs from upstream.
package sidecar
