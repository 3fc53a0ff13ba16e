package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hybridrate/hybridrate/internal/redistest"
)

// upstreamModule is the envoyproxy/ratelimit the oracle test compares with (issue 22).
const upstreamModule = "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"

// upstreamBinary returns envoyproxy/ratelimit's service_cmd at the pinned version: in GOPATH/bin,
// or installed with go install into a cache directory (about a minute). When it cannot be built the
// test is skipped, or fails when CI is "true".
func upstreamBinary(t *testing.T) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "hybridrate-tools", "ratelimit-3fb702589d36")
	if p := filepath.Join(bin, "service_cmd"); fileExists(p) {
		return p
	}
	t.Logf("installing envoyproxy/ratelimit into %s", bin)
	cmd := exec.Command("go", "install", upstreamModule)
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		msg := "envoyproxy/ratelimit is not installed and `go install " + upstreamModule + "` failed: " +
			err.Error() + "\n" + string(out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return filepath.Join(bin, "service_cmd")
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// oracleConfig exercises what both servers must answer alike; upstream's README examples and
// integration cases, in hour and day windows so that a sequence stays in one window.
const oracleConfig = `domain: oracle
descriptors:
  - key: basic
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: basic
    value: vip
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: path
    value: /foo*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: shared
    value: /bar*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: blocked
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: specific
    rate_limit:
      unit: hour
      requests_per_unit: 4
      name: specific
      replaces: [{name: general}]
  - key: general
    rate_limit: {unit: hour, requests_per_unit: 2, name: general}
  - key: deep
    descriptors:
      - key: deeper
        rate_limit: {unit: hour, requests_per_unit: 2}
`

// TestOracleUpstreamAnswersEqual runs envoyproxy/ratelimit and hybridrated from the same
// environment and configuration directory on one redis-server, sends both the same request
// sequences over gRPC and requires equal codes, current limits, remaining counts, headers and
// resets (within a second: the two answers are read a moment apart).
func TestOracleUpstreamAnswersEqual(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the oracle test starts envoyproxy/ratelimit")
	}
	bin := upstreamBinary(t)
	srv := redistest.Start(t)
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "oracle.yaml"), []byte(oracleConfig), 0o644))
	env := map[string]string{
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr, "USE_STATSD": "false", "LOG_LEVEL": "warn",
		"LIMIT_RESPONSE_HEADERS_ENABLED": "true",
	}

	// Upstream.
	grpcPort := freePort(t)
	cmd := exec.Command(bin)
	cmd.Env = []string{"HOME=" + root, "PATH=" + os.Getenv("PATH"),
		"PORT=" + strconv.Itoa(freePort(t)), "GRPC_PORT=" + strconv.Itoa(grpcPort), "DEBUG_PORT=" + strconv.Itoa(freePort(t))}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("envoyproxy/ratelimit's output:\n%s", out.String())
		}
	})
	up := dialRLS(t, "127.0.0.1:"+strconv.Itoa(grpcPort))

	// hybridrated, from the same environment.
	cfg, err := parseConfig(nil, func(k string) string { return env[k] }, os.Stderr)
	require.NoError(t, err)
	require.NotNil(t, cfg.compat)
	cfg.compat.debugAddr = "127.0.0.1:0"
	a, _ := start(t, cfg)
	ours := dialRLS(t, a.grpc)
	b, _ := start(t, cfg) // a second replica on the same Redis
	replica := dialRLS(t, b.grpc)

	// Wait until upstream answers with its configuration loaded.
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := up.ShouldRateLimit(context.Background(), req(1, d("warmup", "x")))
		if err == nil && r != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("envoyproxy/ratelimit did not answer within 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	cases := []struct {
		name string
		reqs []*rlsv3.RateLimitRequest
	}{
		{"basic: default, then over", repeat(5, req(1, d("basic", "a")))},
		{"exact value before default", repeat(7, req(1, d("basic", "vip")))},
		{"nested", repeat(4, req(1, d("message_type", "marketing", "to_number", "123")))},
		{"shallow: stops above the limit", repeat(2, req(1, d("message_type", "marketing")))},
		{"deep: past the tree", repeat(2, req(1, d("basic", "b", "extra", "x")))},
		{"key-only node without a limit, then its child", repeat(3, req(1, d("deep", "1", "deeper", "2")))},
		{"wildcard", []*rlsv3.RateLimitRequest{req(1, d("path", "/foo/1")), req(1, d("path", "/foo/1")), req(1, d("path", "/foo/1")), req(1, d("path", "/foo/2"))}},
		{"share_threshold", []*rlsv3.RateLimitRequest{req(1, d("shared", "/bar/1")), req(1, d("shared", "/bar/2")), req(1, d("shared", "/bar/3"))}},
		{"unlimited and unknown keys", repeat(3, req(1, d("free", "x"), d("nothing", "y")))},
		{"shadow_mode", repeat(3, req(1, d("shadow", "x")))},
		{"zero per unit", repeat(2, req(1, d("blocked", "x")))},
		{"replaces", repeat(3, req(1, d("specific", "s"), d("general", "g")))},
		{"replaced limit alone", repeat(3, req(1, d("general", "g2")))},
		{"hits_addend", repeat(3, req(2, d("basic", "h")))},
		{"several descriptors, one over", repeat(4, req(1, d("basic", "m1"), d("path", "/foo/m")))},
		{"long and empty values", repeat(4, req(1, d("basic", strings.Repeat("v", 300)), d("basic", "")))},
		{"unknown domain", repeat(2, &rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*rlv3.RateLimitDescriptor{d("basic", "a")}})},
		{"two replicas share the counters", repeat(5, req(1, d("basic", "replicas")))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i, r := range tc.reqs {
				want, err := up.ShouldRateLimit(context.Background(), r)
				require.NoError(t, err, "upstream, request %d", i)
				c := ours
				if i%2 == 1 && strings.HasPrefix(tc.name, "two replicas") {
					c = replica
				}
				got, err := c.ShouldRateLimit(context.Background(), r)
				require.NoError(t, err, "hybridrated, request %d", i)
				requireSame(t, want, got, i)
			}
		})
	}

	// Reload: a file added to the directory applies on both (each probe counts under its own value).
	t.Run("reload", func(t *testing.T) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "reload.yaml"), []byte(oracleReload), 0o644))
		for name, c := range map[string]rlsv3.RateLimitServiceClient{"upstream": up, "hybridrated": ours} {
			probe := 0
			require.Eventually(t, func() bool {
				probe++
				r, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "reloaded",
					Descriptors: []*rlv3.RateLimitDescriptor{d("key1", "probe"+strconv.Itoa(probe))}})
				return err == nil && r.Statuses[0].CurrentLimit != nil
			}, 20*time.Second, 50*time.Millisecond, "%s did not reload", name)
		}
		r := &rlsv3.RateLimitRequest{Domain: "reloaded", Descriptors: []*rlv3.RateLimitDescriptor{d("key1", "v")}}
		for i := range 3 {
			want, err := up.ShouldRateLimit(context.Background(), r)
			require.NoError(t, err)
			got, err := ours.ShouldRateLimit(context.Background(), r)
			require.NoError(t, err)
			requireSame(t, want, got, i)
		}
	})
}

// oracleReload is a second file, written while both servers run.
const oracleReload = `domain: reloaded
descriptors:
  - key: key1
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// describeResponse renders what must be equal, resets aside (see resets).
func describeResponse(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "overall %s\n", r.OverallCode)
	for i, s := range r.Statuses {
		fmt.Fprintf(&b, "%d: %s remaining %d", i, s.Code, s.LimitRemaining)
		if l := s.CurrentLimit; l != nil {
			fmt.Fprintf(&b, " limit %d/%s name %q", l.RequestsPerUnit, l.Unit, l.Name)
		}
		fmt.Fprintf(&b, " reset %t\n", s.DurationUntilReset != nil)
	}
	for _, h := range r.ResponseHeadersToAdd {
		v := h.Value
		if strings.EqualFold(h.Key, "RateLimit-Reset") {
			v = "(reset)"
		}
		fmt.Fprintf(&b, "header %s: %s\n", h.Key, v)
	}
	return b.String()
}

// resets returns the response's resets in seconds: each status's, then the reset header's.
func resets(r *rlsv3.RateLimitResponse) []int64 {
	var out []int64
	for _, s := range r.Statuses {
		out = append(out, s.DurationUntilReset.GetSeconds())
	}
	for _, h := range r.ResponseHeadersToAdd {
		if strings.EqualFold(h.Key, "RateLimit-Reset") {
			n, _ := strconv.ParseInt(h.Value, 10, 64)
			out = append(out, n)
		}
	}
	return out
}

// requireSame requires equal answers, resets within a second (the two are read a moment apart).
func requireSame(t *testing.T, want, got *rlsv3.RateLimitResponse, i int) {
	t.Helper()
	require.Equal(t, describeResponse(want), describeResponse(got), "request %d", i)
	w, g := resets(want), resets(got)
	require.Len(t, g, len(w))
	for j := range w {
		require.InDelta(t, w[j], g[j], 1, "request %d: reset %d: upstream %v, hybridrated %v", i, j, w, g)
	}
}

func dialRLS(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func d(kv ...string) *rlv3.RateLimitDescriptor {
	out := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func req(hits uint32, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: "oracle", Descriptors: ds}
	if hits != 1 {
		r.HitsAddend = hits
	}
	return r
}

func repeat(n int, r *rlsv3.RateLimitRequest) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, n)
	for i := range out {
		out[i] = r
	}
	return out
}
