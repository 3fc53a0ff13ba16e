package main

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hybridrate/hybridrate/internal/cputime"
	"github.com/hybridrate/hybridrate/policy/policytest"
)

// echoRLS answers every call OK with no work: gRPC's own cost.
type echoRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (echoRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// BenchmarkGRPC is bench/rlsbench in one process: ShouldRateLimit over loopback TCP from 8
// goroutines sharing one client connection, 1,000 keys in turn, in upstream's terms
// (bench/rlsbench's configuration, window leases). "echo-default" is a gRPC server with gRPC's
// defaults that answers OK without work, "echo" the same with hybridrated's server options
// (grpcServerOptions), "sidecar" hybridrated's serving path (observe.Observer, upstream's
// statistics, window leases on a real redis-server) with those options: sidecar minus echo is
// what a decision adds to gRPC's own cost.
func BenchmarkGRPC(b *testing.B) {
	b.Run("echo-default", func(b *testing.B) { benchGRPC(b, echoRLS{}, nil) })
	b.Run("echo", func(b *testing.B) { benchGRPC(b, echoRLS{}, grpcServerOptions()) })
	b.Run("sidecar", func(b *testing.B) { benchGRPC(b, benchSidecar(b), grpcServerOptions()) })
}

// benchSidecar returns hybridrated's RateLimitService for bench/rlsbench's configuration, wired as
// run wires it in upstream's mode (policytest.BenchSidecar, observed).
func benchSidecar(b *testing.B) rlsv3.RateLimitServiceServer {
	s, _ := policytest.BenchSidecar(b, true)
	return s
}

// benchGRPC serves impl with opts on a loopback port and calls it from 8 goroutines (4 per
// GOMAXPROCS on 2 cores) over one connection, checking every answer.
func benchGRPC(b *testing.B, impl rlsv3.RateLimitServiceServer, opts []grpc.ServerOption) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(gs, impl)
	go func() { _ = gs.Serve(l) }()
	b.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	c := rlsv3.NewRateLimitServiceClient(conn)
	reqs := policytest.BenchRequests()
	ctx := context.Background()
	for _, r := range reqs { // connections up, every key's first trip to Redis done
		if _, err := c.ShouldRateLimit(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	cpu0 := cputime.Process()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, err := c.ShouldRateLimit(ctx, reqs[int(next.Add(1))%len(reqs)])
			if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
				b.Errorf("%v %v", r, err)
				return
			}
		}
	})
	cputime.Report(b, cpu0) // client and server: one process
}
