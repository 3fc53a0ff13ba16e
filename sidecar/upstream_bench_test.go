package sidecar_test

import (
	"context"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/hybridrate/hybridrate/internal/cputime"
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

// upstreamBenchServer returns policytest.BenchSidecar's Server and Enforcer and
// policytest.BenchRequests, each key checked once (its first check goes to Redis; later ones are
// served from leases).
func upstreamBenchServer(b *testing.B, observed bool) (*sidecar.Server, *policy.Enforcer, []*rlsv3.RateLimitRequest) {
	b.Helper()
	s, enf := policytest.BenchSidecar(b, observed)
	reqs := policytest.BenchRequests()
	ctx := context.Background()
	for _, r := range reqs {
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
