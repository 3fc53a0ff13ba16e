// Package dashboard serves a live view of a policy's denials as an [http.Handler], to mount in any
// Go service or in the hybridrated sidecar:
//
//	obs, _ := observe.New(enf, observe.Config{})
//	mux.Handle("/ratelimit/", http.StripPrefix("/ratelimit", dashboard.Handler(obs)))
//
// The page shows, over the last minutes and updated every second: checks and denials per second (an
// SVG chart), the deny rate per route, rule and tier, the most denied keys (keyed hashes, never raw
// keys), the decision sources (local, central, deny-cache, fallback, strict, memo), and the state of
// Redis and of each circuit breaker. It is plain HTML and JavaScript embedded in the binary, with no
// build step and nothing loaded from elsewhere; its data comes from GET api/snapshot (the
// observe.Snapshot as JSON), which scripts and tests can read too.
//
// The dashboard shows rule ids, route patterns, tiers and hashed keys. Mount it where only
// operators can reach it.
package dashboard
