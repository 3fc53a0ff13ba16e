package sidecar_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/sidecar"
)

// BenchmarkUpstreamLeased is one envoyproxy/ratelimit request (one descriptor, 1,000 keys far under
// a limit of 10⁸ per hour) answered in process, without gRPC, as hybridrated's defaults answer it:
// upstream's windows served from window leases (10s). bench/rlsbench measures the same over gRPC.
func BenchmarkUpstreamLeased(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b, func(o *redis.Options) { o.MaxRetries = -1 })
	enf, err := policy.NewEnforcer(
		rdb,
		policy.WithStrictTimeout(time.Second),
		policy.WithWindowLeases(10*time.Second),
	)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = enf.Close(context.Background()) })
	f, err := policy.ParseUpstream([]byte("domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100000000}\n"), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := policy.NewUpstreamConfig([]*policy.UpstreamFile{f})
	if err != nil {
		b.Fatal(err)
	}
	if err := enf.SetPolicy(cfg.Policy()); err != nil {
		b.Fatal(err)
	}
	s, err := sidecar.New(enf, sidecar.WithUpstream(func() *policy.UpstreamConfig { return cfg }))
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
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, err := s.ShouldRateLimit(ctx, reqs[int(next.Add(1))%len(reqs)])
			if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
				b.Errorf("%v %v", r, err)
				return
			}
		}
	})
	b.StopTimer()
	h := enf.StrictHealth()
	b.ReportMetric(float64(h.Calls)*1000/float64(b.N+len(reqs)), "redis-calls/1000")
}
