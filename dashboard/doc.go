// Package dashboard serves a live view of a policy's denials as an [http.Handler], to mount in any
// Go service or in the hybridrated sidecar:
//
//	obs, _ := observe.New(enf)
//	mux.Handle("/ratelimit/", http.StripPrefix("/ratelimit", dashboard.Handler(obs)))
//
// The page shows, over the last minutes and updated every second: checks and denials per second (an
// SVG chart), the deny rate per rule as a trend, per route, rule and tier, the most denied keys
// (keyed hashes, never raw keys, unless observe.WithRevealSubjects shows this process's), the
// decision sources (local, central, deny-cache, fallback, strict, memo), and the state of Redis and
// of each circuit breaker. It is plain HTML and JavaScript embedded in the binary, with no build
// step and nothing loaded from elsewhere; its data comes from GET api/snapshot (the
// observe.Snapshot as JSON), which scripts and tests can read too.
//
// With [WithFleet] and an observe.Fleet that every instance runs, the page also shows the fleet:
// every live instance, the fleet's deny rate per rule and its most denied subjects, and any one
// instance's on a click (GET api/fleet: the observe.FleetView as JSON):
//
//	fleet, _ := observe.NewFleet(obs, rdb)
//	go fleet.Run(ctx)
//	mux.Handle("/ratelimit/", http.StripPrefix("/ratelimit", dashboard.Handler(obs, dashboard.WithFleet(fleet))))
//
// The dashboard shows rule ids, route patterns, tiers and hashed keys (and readable ones where
// configured). Mount it where only operators can reach it.
package dashboard
