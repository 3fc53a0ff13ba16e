package main

import (
	"context"
	"fmt"
	"maps"
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

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
  - key: leased
    rate_limit: {unit: hour, requests_per_unit: 200}
  - key: leased_big
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: deep
    descriptors:
      - key: deeper
        rate_limit: {unit: hour, requests_per_unit: 2}
`

// oracle is envoyproxy/ratelimit and hybridrated (two replicas) started from one environment and
// configuration directory on one redis-server.
type oracle struct {
	dir               string // the configuration directory
	up, ours, replica rlsv3.RateLimitServiceClient
	upProm            string   // upstream's PROMETHEUS_ADDR
	oursHTTP          []string // the HTTP addresses of hybridrated's replicas (their /metrics)
}

// startOracle writes files into a configuration directory and starts upstream and two hybridrated
// replicas from env plus that directory, on srv; it returns once upstream answers.
func startOracle(t *testing.T, bin string, srv *redistest.Server, files map[string]string, env map[string]string) *oracle {
	t.Helper()
	root := t.TempDir()
	o := &oracle{dir: filepath.Join(root, "ratelimit", "config")}
	require.NoError(t, os.MkdirAll(o.dir, 0o755))
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(o.dir, name), []byte(body), 0o644))
	}
	env = maps.Clone(env)
	maps.Copy(env, map[string]string{
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr, "USE_STATSD": "false", "LOG_LEVEL": "warn",
	})

	// Upstream, with its Prometheus sink flushed every 20ms.
	grpcPort := freePort(t)
	o.upProm = "127.0.0.1:" + strconv.Itoa(freePort(t))
	cmd := exec.Command(bin)
	cmd.Env = []string{"HOME=" + root, "PATH=" + os.Getenv("PATH"),
		"PORT=" + strconv.Itoa(freePort(t)), "GRPC_PORT=" + strconv.Itoa(grpcPort), "DEBUG_PORT=" + strconv.Itoa(freePort(t)),
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=" + o.upProm, "STATS_FLUSH_INTERVAL=20ms"}
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
	o.up = dialRLS(t, "127.0.0.1:"+strconv.Itoa(grpcPort))

	// hybridrated, from the same environment.
	cfg, err := parseConfig(nil, func(k string) string { return env[k] }, os.Stderr)
	require.NoError(t, err)
	require.NotNil(t, cfg.compat)
	cfg.compat.debugAddr, cfg.compat.promAddr = "127.0.0.1:0", "" // /metrics on PORT
	a, _ := start(t, cfg)
	b, _ := start(t, cfg) // a second replica on the same Redis
	o.ours, o.replica, o.oursHTTP = dialRLS(t, a.grpc), dialRLS(t, b.grpc), []string{a.http, b.http}

	// Wait until upstream answers with its configuration loaded.
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := o.up.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "warmup",
			Descriptors: []*rlv3.RateLimitDescriptor{d("warmup", "x")}})
		if err == nil && r != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("envoyproxy/ratelimit did not answer within 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return o
}

// oracleCase is a request sequence sent to both servers, request by request.
type oracleCase struct {
	name string
	reqs []*rlsv3.RateLimitRequest
	// window is the shortest window the case's limits use; a case starts early enough in it to end
	// in it (a sequence takes a few milliseconds).
	window time.Duration
	// replicas alternates hybridrated's replicas (even requests to one, odd to the other).
	replicas bool
	// slack, with replicas, lets each remaining count (status and header) differ from upstream's
	// by this much: what the replicas' leases of a window allow (docs/accuracy.md, "Leased upstream
	// windows"); codes, limits and resets must still be equal.
	slack uint32
}

// run sends each case's requests to both servers and requires equal answers.
func (o *oracle) run(t *testing.T, cases []oracleCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.window > 0 {
				waitWindowStart(tc.window)
			}
			for i, r := range tc.reqs {
				want, err := o.up.ShouldRateLimit(context.Background(), r)
				require.NoError(t, err, "upstream, request %d", i)
				c := o.ours
				if tc.replicas && i%2 == 1 {
					c = o.replica
				}
				got, err := c.ShouldRateLimit(context.Background(), r)
				require.NoError(t, err, "hybridrated, request %d", i)
				if tc.slack > 0 {
					requireWithin(t, want, got, tc.slack, i)
					continue
				}
				requireSame(t, want, got, i)
			}
		})
	}
}

// waitWindowStart returns when the current epoch-aligned window of length w has at least 70% of it,
// or 2 s, left, so that a short sequence (tens of milliseconds) sent now ends in it on both servers.
func waitWindowStart(w time.Duration) {
	for {
		left := w - time.Duration(time.Now().UnixNano()%int64(w))
		if left >= min(w*7/10, 2*time.Second) {
			return
		}
		time.Sleep(left + time.Millisecond)
	}
}

// TestOracleUpstreamAnswersEqual runs envoyproxy/ratelimit and hybridrated from the same
// environment and configuration directory on one redis-server, sends both the same request
// sequences over gRPC and requires equal codes, current limits, remaining counts, headers and
// resets (within a second: the two answers are read a moment apart): upstream's README examples
// 1 to 11 unchanged, its integration cases, and the cases around them.
func TestOracleUpstreamAnswersEqual(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the oracle test starts envoyproxy/ratelimit")
	}
	bin := upstreamBinary(t)
	srv := redistest.Start(t)
	files := map[string]string{"oracle.yaml": oracleConfig}
	for name, c := range readmeExamples(t) {
		files["readme-"+name] = c
	}
	o := startOracle(t, bin, srv, files, map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true"})

	o.run(t, []oracleCase{
		{name: "basic: default, then over", reqs: repeat(5, req(1, d("basic", "a")))},
		{name: "exact value before default", reqs: repeat(7, req(1, d("basic", "vip")))},
		{name: "nested", reqs: repeat(4, req(1, d("message_type", "marketing", "to_number", "123")))},
		{name: "shallow: stops above the limit", reqs: repeat(2, req(1, d("message_type", "marketing")))},
		{name: "deep: past the tree", reqs: repeat(2, req(1, d("basic", "b", "extra", "x")))},
		{name: "key-only node without a limit, then its child", reqs: repeat(3, req(1, d("deep", "1", "deeper", "2")))},
		{name: "wildcard", reqs: seq(req(1, d("path", "/foo/1")), req(1, d("path", "/foo/1")), req(1, d("path", "/foo/1")), req(1, d("path", "/foo/2")))},
		{name: "wildcard prefix only, and no match", reqs: seq(req(1, d("path", "/foo")), req(1, d("path", "/fo")), req(1, d("path", "")))},
		{name: "share_threshold", reqs: seq(req(1, d("shared", "/bar/1")), req(1, d("shared", "/bar/2")), req(1, d("shared", "/bar/3")))},
		{name: "unlimited and unknown keys", reqs: repeat(3, req(1, d("free", "x"), d("nothing", "y")))},
		{name: "shadow_mode", reqs: repeat(3, req(1, d("shadow", "x")))},
		{name: "zero per unit", reqs: repeat(2, req(1, d("blocked", "x")))},
		{name: "replaces", reqs: repeat(3, req(1, d("specific", "s"), d("general", "g")))},
		{name: "replaced limit alone", reqs: repeat(3, req(1, d("general", "g2")))},
		{name: "hits_addend", reqs: repeat(3, req(2, d("basic", "h")))},
		{name: "hits_addend: refused hits count", reqs: seq(req(2, d("basic", "h2")), req(2, d("basic", "h2")), req(1, d("basic", "h2")))},
		{name: "hits_addend above the limit", reqs: seq(req(10, d("basic", "h3")), req(1, d("basic", "h3")), req(1, d("basic", "h3")))},
		{name: "hits_addend 0 checks only", reqs: seq(check(d("basic", "c")), req(1, d("basic", "c")), check(d("basic", "c")),
			req(2, d("basic", "c")), check(d("basic", "c")), req(1, d("basic", "c")), check(d("basic", "c")))},
		{name: "hits_addend per descriptor", reqs: seq(
			req(1, hitsOf(2, d("basic", "p1")), hitsOf(0, d("basic", "p2")), d("basic", "p3")),
			req(3, hitsOf(2, d("basic", "p1")), hitsOf(0, d("basic", "p2")), d("basic", "p3")),
			req(1, hitsOf(0, d("basic", "p1")), hitsOf(1, d("basic", "p2")), d("basic", "p3")))},
		{name: "hits_addend 0 on unlimited, zero and shadow limits", reqs: repeat(2, req(1, hitsOf(0, d("free", "z")), hitsOf(0, d("blocked", "z")), hitsOf(0, d("shadow", "z"))))},
		{name: "several descriptors, one over", reqs: repeat(4, req(1, d("basic", "m1"), d("path", "/foo/m")))},
		{name: "several descriptors, every one counted", reqs: seq(req(1, d("basic", "s1"), d("basic", "s2")), req(3, d("basic", "s1")), req(1, d("basic", "s2")), req(1, d("basic", "s1"), d("basic", "s2")))},
		{name: "long and empty values", reqs: repeat(4, req(1, d("basic", strings.Repeat("v", 300)), d("basic", "")))},
		{name: "very long values and keys", reqs: repeat(4, req(1, d("basic", strings.Repeat("w", 5000)), d(strings.Repeat("k", 2000), "x")))},
		{name: "an entry with an empty key", reqs: repeat(2, req(1, d("", "x"), d("basic", "e")))},
		{name: "unknown domain", reqs: repeat(2, &rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*rlv3.RateLimitDescriptor{d("basic", "a")}})},
		{name: "an empty descriptor", reqs: repeat(2, req(1, d(), d("basic", "ed")))},
		{name: "two replicas share the counters", reqs: repeat(5, req(1, d("basic", "replicas"))), replicas: true},
		{name: "two replicas, hits_addend", reqs: seq(req(2, d("basic", "r2")), req(2, d("basic", "r2")), check(d("basic", "r2")), req(1, d("basic", "r2"))), replicas: true},
	})
	o.run(t, readmeCases())
	o.run(t, leaseCases())
	// The lease cases were served mostly without Redis (hybridrate.strict.window_lease_hits).
	leaseHits := 0.0
	for _, h := range o.oursHTTP {
		leaseHits += promSum(t, "http://"+h+"/metrics", "hybridrate_strict_window_lease_hits_total")
	}
	t.Logf("checks served from window leases: %.0f of the lease cases' 560", leaseHits)
	require.Greater(t, leaseHits, 300.0, "checks served from window leases, of the 560 the lease cases sent")

	// Upstream's statistics under its Prometheus names: hybridrated's two replicas together count
	// what upstream counts.
	t.Run("metrics", func(t *testing.T) {
		var want, got map[string]float64
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			// Upstream flushes its statistics every 20ms: poll until they settle to ours.
			want = scrapeUpstreamNames(t, "http://"+o.upProm+"/metrics")
			got = map[string]float64{}
			for _, h := range o.oursHTTP {
				for k, v := range scrapeUpstreamNames(t, "http://"+h+"/metrics") {
					got[k] += v
				}
			}
			if maps.Equal(want, got) {
				break
			}
		}
		require.Equal(t, want, got)
		require.Greater(t, len(want), 100, "every case's limits")
		for _, url := range []string{"http://" + o.upProm + "/metrics", "http://" + o.oursHTTP[0] + "/metrics"} {
			_, body := get(t, url)
			require.Contains(t, body, "\nratelimit_service_config_load_success 1\n", url)
		}
	})

	// Reload: a file added to the directory applies on both (each probe counts under its own value).
	t.Run("reload", func(t *testing.T) {
		require.NoError(t, os.WriteFile(filepath.Join(o.dir, "reload.yaml"), []byte(oracleReload), 0o644))
		for name, c := range map[string]rlsv3.RateLimitServiceClient{"upstream": o.up, "hybridrated": o.ours} {
			probe := 0
			require.Eventually(t, func() bool {
				probe++
				r, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "reloaded",
					Descriptors: []*rlv3.RateLimitDescriptor{d("key1", "probe"+strconv.Itoa(probe))}})
				return err == nil && r.Statuses[0].CurrentLimit != nil
			}, 20*time.Second, 50*time.Millisecond, "%s did not reload", name)
		}
		o.run(t, []oracleCase{{name: "after", reqs: repeat(3, &rlsv3.RateLimitRequest{Domain: "reloaded",
			Descriptors: []*rlv3.RateLimitDescriptor{d("key1", "v")}})}})
	})
}

// TestOracleStopIncrementWhenOverLimit compares the two under STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
// (and SHADOW_MODE): a request that would take one of its limits over counts only on that limit.
func TestOracleStopIncrementWhenOverLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the oracle test starts envoyproxy/ratelimit")
	}
	bin := upstreamBinary(t)
	srv := redistest.Start(t)
	o := startOracle(t, bin, srv, map[string]string{"oracle.yaml": oracleConfig},
		map[string]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true", "SHADOW_MODE": "true"})
	o.run(t, []oracleCase{
		{name: "one descriptor", reqs: seq(req(2, d("basic", "a")), req(2, d("basic", "a")), req(1, d("basic", "a")), check(d("basic", "a")))},
		{name: "the other descriptor is not charged", reqs: seq(
			req(1, d("basic", "x"), d("path", "/foo/x")),
			req(1, d("basic", "x"), d("path", "/foo/x")),
			req(1, d("basic", "x"), d("path", "/foo/x")),
			req(1, d("basic", "x")), req(1, d("basic", "x")), check(d("basic", "x")))},
		{name: "zero per unit stops the others", reqs: seq(req(1, d("basic", "z"), d("blocked", "z")), req(1, d("basic", "z")))},
		{name: "replicas", reqs: repeat(5, req(1, d("basic", "r"), d("path", "/foo/r"))), replicas: true},
	})
}

// readmeDir holds the configurations of upstream's README, examples 1 to 11, unchanged (one file
// per domain); policy's tests read them too.
const readmeDir = "../../policy/testdata/upstream-readme"

// readmeExamples returns the files of readmeDir by name.
func readmeExamples(t *testing.T) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(readmeDir)
	require.NoError(t, err)
	out := make(map[string]string, len(ents))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(readmeDir, e.Name()))
		require.NoError(t, err)
		out[e.Name()] = string(b)
	}
	require.Len(t, out, 13, "the README's examples")
	return out
}

// readmeCases are the requests the README's examples describe, run through the limits.
func readmeCases() []oracleCase {
	in := func(domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		r := req(hits, ds...)
		r.Domain = domain
		return r
	}
	var cases []oracleCase
	add := func(name string, window time.Duration, reqs ...[]*rlsv3.RateLimitRequest) {
		var all []*rlsv3.RateLimitRequest
		for _, r := range reqs {
			all = append(all, r...)
		}
		cases = append(cases, oracleCase{name: "README " + name, reqs: all, window: window})
	}
	add("example 1: two values of one key", time.Second,
		repeat(3, in("mongo_cps", 1, d("database", "users"))), repeat(2, in("mongo_cps", 1, d("database", "default"))),
		repeat(2, in("mongo_cps", 1, d("database", "other"))), seq(in("mongo_cps", 600, d("database", "users"))))
	add("example 2: nested and overall limits in one request", 0,
		repeat(6, in("messaging", 1, d("message_type", "marketing", "to_number", "2061111111"), d("to_number", "2061111111"))),
		repeat(2, in("messaging", 1, d("message_type", "marketing", "to_number", "2062222222"))),
		seq(in("messaging", 95, d("to_number", "2061111111")), in("messaging", 1, d("to_number", "2061111111"))))
	add("example 3: exact value before key", time.Second,
		repeat(11, in("edge_proxy_per_ip", 1, d("remote_address", "50.0.0.1"))),
		repeat(2, in("edge_proxy_per_ip", 1, d("remote_address", "50.0.0.5"))))
	add("example 4: levels must match", time.Second,
		repeat(2, in("example4", 1, d("key", "value", "subkey", "subvalue"))), repeat(2, in("example4", 1, d("key", "value"))))
	add("example 5: unlimited", time.Minute,
		repeat(3, in("internal", 1, d("ldap", "x"), d("azure", "y"))), seq(in("internal", 98, d("azure", "y")), in("internal", 1, d("azure", "y"))))
	add("example 6: shadow_mode", time.Second,
		repeat(12, in("example6", 1, d("service", "auth-service", "user", "user-a"))),
		repeat(3, in("example6", 8, d("service", "auth-service", "user", "user-b"))))
	add("example 7: replaces", time.Second,
		repeat(7, in("example7", 1, d("key_1", "value_1", "user", "bkthomps"), d("key_2", "value_2", "user", "bkthomps"))),
		repeat(6, in("example7", 1, d("key_1", "value_1", "user", "bkthomps"))),
		repeat(4, in("example7", 1, d("key_2", "value_2", "user", "bkthomps"))))
	add("example 8: detailed_metric", time.Minute,
		seq(in("example8", 9, d("key1", "unspecified_value")), in("example8", 2, d("key1", "unspecified_value"))),
		repeat(2, in("example8", 1, d("key1", "unspecified_value2"))), seq(in("example8", 19, d("key1", "value1")), in("example8", 2, d("key1", "value1"))))
	add("example 9: wildcard", time.Minute,
		seq(in("example9", 19, d("key1", "value_1")), in("example9", 1, d("key1", "value_1")), in("example9", 1, d("key1", "value_1"))),
		repeat(2, in("example9", 1, d("key1", "value_2"))), repeat(2, in("example9", 1, d("key1", "valu"))))
	add("example 10: value_to_metric", time.Minute,
		repeat(2, in("example10", 30, d("route", "api", "http_method", "GET", "subject_id", "123"))),
		repeat(2, in("example10", 1, d("route", "api", "http_method", "GET", "subject_id", "123"))),
		repeat(2, in("example10", 1, d("route", "web", "http_method", "POST", "subject_id", "456"))),
		repeat(2, in("example10_wildcard", 60, d("user", "alice", "action", "readfile", "resource", "documents"))),
		repeat(2, in("example10_wildcard", 1, d("user", "alice", "action", "writefile", "resource", "documents"))))
	add("example 11: share_threshold", 0,
		repeat(5, in("example11", 1, d("files", "files/a.pdf"))), repeat(5, in("example11", 1, d("files", "files/b.csv"))),
		repeat(2, in("example11", 1, d("files", "files/c.txt"))),
		repeat(10, in("example11", 1, d("files_no_share", "files_no_share/a.pdf"))), repeat(2, in("example11", 1, d("files_no_share", "files_no_share/b.csv"))),
		repeat(2, in("example11_metrics", 30, d("route", "api/v1", "method", "GET"), d("route", "api/v2", "method", "GET"))),
		repeat(2, in("example11_metrics", 1, d("route", "api/v1", "method", "POST"))))
	return cases
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

// requireWithin requires what requireSame requires, except that remaining counts may differ by up
// to slack.
func requireWithin(t *testing.T, want, got *rlsv3.RateLimitResponse, slack uint32, i int) {
	t.Helper()
	strip := func(r *rlsv3.RateLimitResponse) (*rlsv3.RateLimitResponse, []int64) {
		r = proto.Clone(r).(*rlsv3.RateLimitResponse)
		var rem []int64
		for _, s := range r.Statuses {
			rem = append(rem, int64(s.LimitRemaining))
			s.LimitRemaining = 0
		}
		for _, h := range r.ResponseHeadersToAdd {
			if strings.EqualFold(h.Key, "RateLimit-Remaining") {
				n, _ := strconv.ParseInt(h.Value, 10, 64)
				rem = append(rem, n)
				h.Value = "(remaining)"
			}
		}
		return r, rem
	}
	w, wr := strip(want)
	g, gr := strip(got)
	requireSame(t, w, g, i)
	require.Len(t, gr, len(wr))
	for j := range wr {
		require.InDelta(t, wr[j], gr[j], float64(slack), "request %d: remaining %d: upstream %v, hybridrated %v", i, j, wr, gr)
	}
}

// leaseCases are sequences long and fast enough for hybridrated's window leases to serve most of
// their requests locally (docs/sidecar.md, "Local-first windows").
func leaseCases() []oracleCase {
	var one, two []*rlsv3.RateLimitRequest
	for i := range 260 {
		switch {
		case i%10 == 9:
			one = append(one, check(d("leased", "one")))
		case i%7 == 3:
			one = append(one, req(3, d("leased", "one")))
		default:
			one = append(one, req(1, d("leased", "one")))
		}
	}
	for range 300 {
		two = append(two, req(1, d("leased_big", "two")))
	}
	return []oracleCase{
		// One replica holds the leases: every answer is upstream's, over the limit too.
		{name: "leases: one replica, through the limit", reqs: one},
		// Two replicas: the remaining counts differ by at most the two leases (at most 1/16 of
		// what was left each); 300 of 1,000 stays below NEAR_LIMIT_RATIO, so the statistics are
		// upstream's too.
		{name: "leases: two replicas", reqs: two, replicas: true, slack: 2 * 1000 / 16},
	}
}

// promSum returns the sum of the series of a metric name that url exports.
func promSum(t *testing.T, url, name string) float64 {
	t.Helper()
	_, body := get(t, url)
	sum := 0.0
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		require.NoError(t, err, line)
		sum += f
	}
	return sum
}

// scrapeUpstreamNames returns the series of upstream's per-limit and per-domain statistics
// (ratelimit_service_rate_limit_*) that url exports, by "name{labels}", without the warm-up
// requests' domain, which only upstream saw.
func scrapeUpstreamNames(t *testing.T, url string) map[string]float64 {
	t.Helper()
	_, body := get(t, url)
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "ratelimit_service_rate_limit_") || strings.Contains(line, "warmup") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, line)
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		out[line[:i]] = v
	}
	return out
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

// check is a request that checks ds without counting (per-descriptor hits_addend 0).
func check(ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	for _, x := range ds {
		hitsOf(0, x)
	}
	return req(1, ds...)
}

// hitsOf sets x's own hits_addend to n and returns x.
func hitsOf(n uint64, x *rlv3.RateLimitDescriptor) *rlv3.RateLimitDescriptor {
	x.HitsAddend = wrapperspb.UInt64(n)
	return x
}

func seq(rs ...*rlsv3.RateLimitRequest) []*rlsv3.RateLimitRequest { return rs }

func repeat(n int, r *rlsv3.RateLimitRequest) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, n)
	for i := range out {
		out[i] = r
	}
	return out
}
