// Package observe makes a policy's decisions visible: it wraps a [policy.Enforcer] (any
// policy.Checker)
// and records every decision in OpenTelemetry metrics, in an in-memory window of the last minutes
// (what package dashboard draws), and in hooks of your own.
//
//	enf, _ := policy.NewEnforcer(rdb, policy.WithHybridOptions(hybrid.WithMeterProvider(mp)))
//	obs, _ := observe.New(enf, observe.WithMeterProvider(mp),
//		observe.WithOnDeny(func(ev *observe.Event) { slog.Info("denied", "rule", ev.Result.Rule, "key", ev.Key) }))
//	rl, _ := policy.NewReloader("policy.yaml", obs)
//	mw, _ := middleware.New(obs, middleware.WithMux(mux)) // an Observer is a policy.Checker
//
// # Metrics
//
// Every instrument carries hybridrate.instance (WithInstance: the host name by default, never a
// random id), and only bounded attributes: rule ids, route patterns and tiers (each capped at
// WithMaxLabels distinct values, the rest counted as "other"), sources and outcomes — never a
// raw key.
//
//   - hybridrate.requests: checks by outcome (allowed; shadow_denied: admitted, but a rule in shadow
//     mode would have denied; denied; missing_key; error),
//     route and tier.
//   - hybridrate.rule.decisions: counter decisions by rule, source (local, central, deny-cache,
//     fallback, strict, memo), outcome (allowed, denied), shadow, route and tier.
//   - hybridrate.rule.near_limit: admitted enforced decisions that left at most WithNearLimit's share of
//     the counter's quota, by rule, route and tier.
//   - hybridrate.rule.shadow_denials: would-be denials of rules in shadow mode (or of any rule while
//     the policy is in shadow mode), by rule, route and tier.
//   - hybridrate.check.duration: decision latency in seconds, by path (local: no Redis round trip;
//     central: a synchronous or strict Redis call; fallback: a failure policy answered) and outcome.
//   - hybridrate.window.denied: the denials the in-memory window holds (the dashboard's span).
//   - hybridrate.strict.calls, hybridrate.strict.errors (by class: error, breaker_open),
//     hybridrate.strict.breaker.state and hybridrate.strict.window_lease_hits (checks of upstream
//     windows served from a window lease, without Redis): the strict rules' Redis client, when the
//     Checker implements [HealthReporter] (a *policy.Enforcer does).
//
// The hybrid limiters' own metrics (package hybrid: decisions by source, reconcile rounds, Redis
// errors by class, breaker state) come from their WithMeterProvider option.
//
// # Fleet
//
// A [Fleet] publishes the window's counters to Redis (one small report per instance, with a TTL,
// every few seconds, in the limiter's own namespace) and reads every live instance's, for the
// dashboard's fleet view: per-rule deny trends in steps aligned on the clock, added up across
// instances, and the most denied subjects, one id per subject across the fleet when every instance
// has the same WithHashKey. Reports carry hashed ids only; WithRevealSubjects keeps readable
// values in the memory of the process that saw them. docs/operations.md ("The fleet view: what
// Redis holds") lists the keys and their cost.
//
// # Cost and concurrency
//
// An Observer is safe for concurrent use. A check through it allocates nothing beyond the wrapped
// Checker's and does no I/O of its own: two clock reads, a few map lookups and atomic adds
// (counters are observed at collection time), one short lock for the window, and the latency
// histogram's Record. docs/benchmarks.md has its measured cost (BenchmarkCheck). It is meant for a
// service's edge or a sidecar, where a decision is part of a request, not for inner loops.
package observe
