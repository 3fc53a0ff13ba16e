package sidecar_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/hybridrate/hybridrate/internal/cputime"
	"github.com/hybridrate/hybridrate/internal/metrictest"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/observe"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/policy/policytest"
	"github.com/hybridrate/hybridrate/sidecar"
)

// BenchmarkUpstreamLeased is one envoyproxy/ratelimit request (one descriptor, 1,000 keys far under
// a limit of 10⁸ per hour) answered in process, without gRPC, as hybridrated's defaults answer it:
// upstream's windows served from window leases (10s). bench/rlsbench measures the same over gRPC.
func BenchmarkUpstreamLeased(b *testing.B) {
	s, enf, reqs := upstreamBenchServer(b, false)
	runUpstreamBench(b, s, enf, reqs)
}

// BenchmarkUpstreamObserved is BenchmarkUpstreamLeased with what hybridrated adds around the
// Enforcer: an observe.Observer and upstream's per-limit statistics, both recording into an
// OpenTelemetry SDK meter provider, as cmd/hybridrated wires them.
func BenchmarkUpstreamObserved(b *testing.B) {
	s, enf, reqs := upstreamBenchServer(b, true)
	runUpstreamBench(b, s, enf, reqs)
}

// upstreamBenchServer returns a Server answering in upstream's terms for bench/rlsbench's
// configuration, the Enforcer behind it, and 1,000 requests, each key checked once (its first
// check goes to Redis; later ones are served from leases).
func upstreamBenchServer(b *testing.B, observed bool) (*sidecar.Server, *policy.Enforcer, []*rlsv3.RateLimitRequest) {
	b.Helper()
	srv := redistest.Start(b)
	rdb := srv.Client(b, redistest.NoRetries)
	enf := policytest.NewEnforcer(b, rdb,
		policy.WithStrictTimeout(time.Second),
		policy.WithWindowLeases(10*time.Second),
		policy.WithDimensions("domain"),
	)
	cfg := policytest.Upstream(b, "bench.yaml", "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100000000}\n")
	var checker policy.Checker = enf
	sopts := []sidecar.Option{sidecar.WithUpstream(func() *policy.UpstreamConfig { return cfg })}
	var target interface{ SetPolicy(*policy.Policy) error } = enf
	if observed {
		mp := metrictest.New(b).Provider
		obs, err := observe.New(enf, observe.WithMeterProvider(mp), observe.WithInstance("bench"), observe.WithWindow(15*time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = obs.Close() })
		target = obs
		checker = obs
		sopts = append(sopts, sidecar.WithMeterProvider(mp), sidecar.WithInstance("bench"),
			sidecar.WithUpstreamStats(new(sidecar.UpstreamStats)), sidecar.WithUpstreamNearLimitRatio(0.8))
	}
	if err := target.SetPolicy(cfg.Policy()); err != nil {
		b.Fatal(err)
	}
	s, err := sidecar.New(checker, sopts...)
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*rlsv3.RateLimitRequest, 1000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u" + strconv.Itoa(i)}}}}}
	}
	ctx := context.Background()
	for _, r := range reqs { // every key's first check goes to Redis; then leases
		if _, err := s.ShouldRateLimit(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	return s, enf, reqs
}

// runUpstreamBench calls s with reqs in turn from b.RunParallel's goroutines, checking every
// answer, and reports Redis calls per 1,000 requests.
func runUpstreamBench(b *testing.B, s *sidecar.Server, enf *policy.Enforcer, reqs []*rlsv3.RateLimitRequest) {
	ctx := context.Background()
	c0 := enf.StrictHealth().Calls
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cputime.Process()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, err := s.ShouldRateLimit(ctx, reqs[int(next.Add(1))%len(reqs)])
			if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || len(r.Statuses) != 1 ||
				r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 100_000_000 {
				b.Errorf("%v %v", r, err)
				return
			}
		}
	})
	cputime.Report(b, cpu0)
	b.ReportMetric(float64(enf.StrictHealth().Calls-c0)*1000/float64(b.N), "redis-calls/1000")
}
