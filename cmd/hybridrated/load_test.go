package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	rssEnv      = flag.String("rss-env", "", "environment of BenchmarkDaemonRSS's hybridrated besides GODEBUG=gctrace=1, comma-separated (e.g. GOMEMLIMIT=400MiB)")
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

// rssPolicy: one hybrid rule per API key, every key decided once under its limit.
const rssPolicy = `
version: 1
rules:
  - id: per-key
    dimensions: [api_key]
    rate: 100
    burst: 100
`

// BenchmarkDaemonRSS reports the resident memory of the hybridrated binary itself (built from this
// package, on a redis-server of its own, the default -max-keys of 1,048,576) once 1,048,576
// distinct API keys have been checked over gRPC (8 callers, 32 keys a call: each a descriptor), and
// after they went idle (-idle-eviction 1m, longer than the fill, so that the run takes minutes, not
// the default's 10 to 20). Metrics (MB from
// /proc/PID/status, keys from its /metrics):
//   - rss-start-MB: serving, before any check;
//   - rss-full-MB, peak-MB (VmHWM): with the keys held; keys: hybridrate_keys then (at the cap a
//     full shard evicts clean keys, so a little under 1,048,576);
//   - fill-s: the seconds the checks took;
//   - live-MB: the heap marked live by the last collection before rss-full-MB was read (gctrace);
//   - rss-idle-MB: 70 s after hybridrate_keys fell to 0, a tick of returnMemory later (hybridrated
//     forces a collection and returns memory once the keys held fall by half: docs/operations.md).
//
// Linux only (-rss-env sets the process's environment, e.g. -rss-env GOMEMLIMIT=400MiB):
//
//	go test ./cmd/hybridrated -run '^$' -bench 'BenchmarkDaemonRSS$' -benchtime 1x
func BenchmarkDaemonRSS(b *testing.B) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		b.Skip("needs /proc")
	}
	srv := redistest.Start(b)
	bin := buildBinary(b)
	path := writePolicy(b, b.TempDir(), rssPolicy)
	const keys, perCall = 1 << 20, 32
	for range b.N {
		env := []string{"GODEBUG=gctrace=1"}
		if *rssEnv != "" {
			env = append(env, strings.Split(*rssEnv, ",")...)
		}
		p := startProcess(b, bin, env, "-redis", srv.Addr, "-policy", path, "-idle-eviction", "1m",
			"-fleet-interval", "0", "-shutdown-grace", "0s", "-check-timeout", "1s")
		pid := p.cmd.Process.Pid
		start := procStatusMB(b, pid, "VmRSS")
		conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(b, err)
		client := rlsv3.NewRateLimitServiceClient(conn)
		var next atomic.Int64
		var wg sync.WaitGroup
		t0 := time.Now()
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				for {
					k := (next.Add(1) - 1) * perCall
					if k >= keys {
						return
					}
					req := &rlsv3.RateLimitRequest{Domain: "rss", Descriptors: make([]*rlv3.RateLimitDescriptor, perCall)}
					for j := range req.Descriptors {
						req.Descriptors[j] = &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{
							{Key: "api_key", Value: "user-" + strconv.FormatInt(k+int64(j), 10)}}}
					}
					r, err := client.ShouldRateLimit(context.Background(), req)
					if err == nil && r.OverallCode != rlsv3.RateLimitResponse_OK {
						err = fmt.Errorf("keys %d to %d: %v", k, k+perCall-1, r.OverallCode)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		fill := time.Since(t0).Seconds()
		close(errs)
		require.NoError(b, <-errs)
		require.NoError(b, conn.Close())
		held := metricValue(b, p.base, "hybridrate_keys")
		full, peak := procStatusMB(b, pid, "VmRSS"), procStatusMB(b, pid, "VmHWM")
		live := lastLiveHeapMB(p.stderr.String())
		require.Eventually(b, func() bool { return metricValue(b, p.base, "hybridrate_keys") == 0 },
			6*time.Minute, time.Second, "every key evicted idle")
		time.Sleep(time.Minute + 10*time.Second) // a tick of returnMemory (the idle eviction's interval)
		idle := procStatusMB(b, pid, "VmRSS")
		require.NoError(b, p.cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(b, <-p.exited)
		b.ReportMetric(start, "rss-start-MB")
		b.ReportMetric(full, "rss-full-MB")
		b.ReportMetric(peak, "peak-MB")
		b.ReportMetric(held, "keys")
		b.ReportMetric(live, "live-MB")
		b.ReportMetric(fill, "fill-s")
		b.ReportMetric(idle, "rss-idle-MB")
	}
}

// procStatusMB reads field (VmRSS, VmHWM) of process pid's /proc status, in MB (10^6 bytes).
func procStatusMB(tb testing.TB, pid int, field string) float64 {
	tb.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(tb, err)
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			require.NoError(tb, err)
			return kb * 1024 / 1e6
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// metricValue sums the samples of the Prometheus metric name (every label set) at base's /metrics.
func metricValue(tb testing.TB, base, name string) float64 {
	tb.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(tb, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	var sum float64
	found := false
	for line := range strings.Lines(string(body)) {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		require.NotEmpty(tb, f, line)
		v, err := strconv.ParseFloat(f[0], 64)
		require.NoError(tb, err, line)
		sum += v
		found = true
	}
	require.True(tb, found, "no %s at %s/metrics", name, base)
	return sum
}

// lastLiveHeapMB returns the live heap after the last collection that GODEBUG=gctrace=1 printed in
// log ("gc N @…: …, A->B->C MB, D MB goal, …": C), in MB (10^6 bytes); 0 if none.
func lastLiveHeapMB(log string) float64 {
	var live float64
	for line := range strings.Lines(log) {
		if !strings.HasPrefix(line, "gc ") {
			continue
		}
		for f := range strings.SplitSeq(line, ",") {
			f = strings.TrimSpace(f)
			if rest, ok := strings.CutSuffix(f, " MB"); ok && strings.Count(rest, "->") == 2 {
				if v, err := strconv.ParseFloat(rest[strings.LastIndex(rest, "->")+2:], 64); err == nil {
					live = v * (1 << 20) / 1e6
				}
			}
		}
	}
	return live
}
