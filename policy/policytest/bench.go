package policytest

import (
	"strconv"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/metrictest"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/observe"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/sidecar"
)

// BenchRequestsN is how many requests, one per key, [BenchRequests] returns.
const BenchRequestsN = 1000

// BenchSidecar returns a sidecar.Server answering in upstream's (envoyproxy/ratelimit's) terms for
// bench/rlsbench's configuration (domain "bench", key "user" limited to 10⁸ per hour) and the
// Enforcer behind it, on a redis-server of its own, wired as hybridrated's defaults wire it:
// window leases of 10s, the "domain" dimension, sidecar.HitsCost. With observed, it adds what
// hybridrated puts around the Enforcer: an observe.Observer and upstream's per-limit statistics,
// both recording into an OpenTelemetry SDK meter provider. Everything is closed in tb.Cleanup.
func BenchSidecar(tb testing.TB, observed bool) (*sidecar.Server, *policy.Enforcer) {
	tb.Helper()
	srv := redistest.Start(tb)
	rdb := srv.Client(tb, redistest.NoRetries)
	enf := NewEnforcer(tb, rdb,
		policy.WithStrictTimeout(time.Second),
		policy.WithWindowLeases(10*time.Second),
		policy.WithDimensions("domain"),
		policy.WithCostFuncs(map[string]policy.CostFunc{sidecar.HitsCostName: sidecar.HitsCost}),
	)
	cfg := Upstream(tb, "bench.yaml", "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100000000}\n")
	var checker policy.Checker = enf
	var target Setter = enf
	sopts := []sidecar.Option{sidecar.WithUpstream(func() *policy.UpstreamConfig { return cfg })}
	if observed {
		mp := metrictest.New(tb).Provider
		obs, err := observe.New(enf, observe.WithMeterProvider(mp), observe.WithInstance("bench"), observe.WithWindow(15*time.Minute))
		if err != nil {
			tb.Fatalf("observe.New: %v", err)
		}
		tb.Cleanup(func() { _ = obs.Close() })
		checker, target = obs, obs
		sopts = append(sopts, sidecar.WithMeterProvider(mp), sidecar.WithInstance("bench"),
			sidecar.WithUpstreamStats(new(sidecar.UpstreamStats)), sidecar.WithUpstreamNearLimitRatio(0.8))
	}
	if err := target.SetPolicy(cfg.Policy()); err != nil {
		tb.Fatalf("SetPolicy: %v", err)
	}
	s, err := sidecar.New(checker, sopts...)
	if err != nil {
		tb.Fatalf("sidecar.New: %v", err)
	}
	return s, enf
}

// BenchRequests returns BenchRequestsN requests for [BenchSidecar]'s configuration, one per key
// ("u0", "u1", …), each far under its limit.
func BenchRequests() []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, BenchRequestsN)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u" + strconv.Itoa(i)}}}}}
	}
	return reqs
}

// Observed returns an observe.Observer for instance in front of an Enforcer on miniredis, with doc
// (a policy file named name) in force, and the reader of the meter provider both record into: the
// fixture of the observe and dashboard tests. Strict calls and hybrid checks time out after a
// second; the Observer's options are WithInstance(instance), then opts, then the meter provider.
// Both are closed in tb.Cleanup.
func Observed(tb testing.TB, instance, doc, name string, opts ...observe.Option) (*observe.Observer, *policy.Enforcer, *metrictest.Reader) {
	tb.Helper()
	_, rdb := redistest.Mini(tb)
	metrics := metrictest.New(tb)
	enf := NewEnforcer(tb, rdb,
		policy.WithStrictTimeout(time.Second),
		policy.WithHybridOptions(
			hybrid.WithCheckTimeout(time.Second), hybrid.WithMeterProvider(metrics.Provider), hybrid.WithInstance(instance)),
	)
	opts = append(append([]observe.Option{observe.WithInstance(instance)}, opts...), observe.WithMeterProvider(metrics.Provider))
	obs, err := observe.New(enf, opts...)
	if err != nil {
		tb.Fatalf("observe.New: %v", err)
	}
	tb.Cleanup(func() { _ = obs.Close() })
	SetPolicy(tb, obs, doc, name)
	return obs, enf, metrics
}
