package main

import (
	"context"
	"flag"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/observe"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/sidecar"
)

var (
	loadFor     = flag.Duration("load", 0, "run TestLoad for this long (0 skips it), e.g. -load 10s")
	loadClients = flag.Int("load-clients", 16, "concurrent gRPC callers of TestLoad")
	loadKeys    = flag.Int("load-keys", 1000, "API keys TestLoad spreads its calls over")
)

// loadPolicy: per-key limits far above the honest keys' rates, so most decisions are local; one key
// in a hundred is an abuser, over its limit all the time.
const loadPolicy = `
version: 1
missing_key: skip
rules:
  - id: per-key
    dimensions: [api_key]
    rate: 1000
    burst: 2000
  - id: per-ip
    dimensions: [ip]
    rate: 100000
    burst: 100000
  - id: abusers
    dimensions: [api_key]
    match: {routes: [abuse]}
    rate: 10
    burst: 10
`

// TestLoad measures the sidecar over gRPC on loopback against a real redis-server: calls per second
// and latency percentiles as a client sees them, each call one ShouldRateLimit with two descriptors
// (api key, client address). It runs only with -load:
//
//	go test ./cmd/hybridrated -run TestLoad -v -load 10s
func TestLoad(t *testing.T) {
	if *loadFor <= 0 {
		t.Skip("a measurement, not a check: run with -load 10s")
	}
	srv := redistest.Start(t)
	a, stop := start(t, config{redisAddr: srv.Addr, policyPath: writePolicy(t, t.TempDir(), loadPolicy)})
	conn, err := grpc.NewClient(a.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)

	// Requests built in advance.
	reqs := make([]*rlsv3.RateLimitRequest, *loadKeys)
	for i := range reqs {
		api := rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "key-" + strconv.Itoa(i)}}}
		if i%100 == 0 {
			api.Entries = append(api.Entries, &rlv3.RateLimitDescriptor_Entry{Key: "route", Value: "abuse"})
		}
		ip := rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250)}}}
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "load", Descriptors: []*rlv3.RateLimitDescriptor{&api, &ip}}
	}
	ctx := context.Background()
	for _, r := range reqs { // warm up: every key known locally and in Redis
		_, err := client.ShouldRateLimit(ctx, r)
		require.NoError(t, err)
	}

	grpcCall := func(ctx context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		return client.ShouldRateLimit(ctx, r)
	}
	measure(t, "sidecar over gRPC, loopback", reqs, grpcCall)

	// The same requests answered in this process, without gRPC: the same packages, on the same Redis.
	rdb := srv.Client(t, redistest.NoRetries)
	enf, err := policy.NewEnforcer(rdb, policy.WithKeyPrefix("inproc"), policy.WithCostFuncs(map[string]policy.CostFunc{sidecar.HitsCostName: sidecar.HitsCost}))
	require.NoError(t, err)
	defer enf.Close(ctx)
	obs, err := observe.New(enf)
	require.NoError(t, err)
	defer obs.Close()
	p, err := policy.Parse([]byte(loadPolicy), "load.yaml")
	require.NoError(t, err)
	require.NoError(t, obs.SetPolicy(p))
	inproc, err := sidecar.New(obs)
	require.NoError(t, err)
	for _, r := range reqs {
		_, err := inproc.ShouldRateLimit(ctx, r)
		require.NoError(t, err)
	}
	measure(t, "same requests in process (sidecar.Server, no gRPC)", reqs, inproc.ShouldRateLimit)
	require.NoError(t, stop())
}

func thousands(f float64) string {
	s := strconv.FormatInt(int64(f+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// measure calls call with reqs from -load-clients goroutines for -load and logs the figures.
func measure(t *testing.T, name string, reqs []*rlsv3.RateLimitRequest,
	call func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)) {
	t.Helper()
	ctx := context.Background()
	var calls, over, failed atomic.Int64
	var mu sync.Mutex
	hist := hdrhistogram.New(1, int64(10*time.Second), 3) // ns
	var wg sync.WaitGroup
	deadline := time.Now().Add(*loadFor)
	start := time.Now()
	for c := 0; c < *loadClients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := hdrhistogram.New(1, int64(10*time.Second), 3)
			for i := c; time.Now().Before(deadline); i += *loadClients {
				t0 := time.Now()
				resp, err := call(ctx, reqs[i%len(reqs)])
				_ = local.RecordValue(int64(time.Since(t0)))
				calls.Add(1)
				switch {
				case err != nil:
					failed.Add(1)
				case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
					over.Add(1)
				}
			}
			mu.Lock()
			hist.Merge(local)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	q := func(p float64) time.Duration { return time.Duration(hist.ValueAtQuantile(p)) }
	n := calls.Load()
	t.Logf("%s, %d clients, %d keys, %v: %s calls/s (%s descriptor decisions/s), "+
		"p50 %v, p99 %v, p99.9 %v, max %v; over limit %.1f%%, errors %d",
		name, *loadClients, len(reqs), elapsed.Round(time.Millisecond), thousands(float64(n)/elapsed.Seconds()),
		thousands(2*float64(n)/elapsed.Seconds()), q(50), q(99), q(99.9), time.Duration(hist.Max()),
		100*float64(over.Load())/float64(max(n, 1)), failed.Load())
	require.Zero(t, failed.Load())
}
