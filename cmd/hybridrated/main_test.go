package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if built.dir != "" {
			_ = os.RemoveAll(built.dir)
		}
		os.Exit(code)
	}))
}

// built is the hybridrated binary that buildBinary made, once for the tests that run processes.
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// buildBinary builds the hybridrated binary on first use and returns its path.
func buildBinary(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "hybridrated-test-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "hybridrated")
		if out, err := exec.Command("go", "build", "-o", built.bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %w: %s", err, out)
		}
	})
	require.NoError(t, built.err)
	return built.bin
}

// start runs the sidecar on free loopback ports until the test ends, and returns its addresses and a
// function that stops it and returns run's error.
func start(t *testing.T, cfg config) (addrs, func() error) {
	t.Helper()
	cfg.grpcAddr, cfg.httpAddr = "127.0.0.1:0", "127.0.0.1:0"
	if cfg.reload == 0 {
		cfg.reload = 10 * time.Millisecond
	}
	if cfg.shutdownTimeout == 0 {
		cfg.shutdownTimeout = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	readyc := make(chan addrs, 1)
	errc := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	go func() { errc <- run(ctx, cfg, log, func(a addrs) { readyc <- a }) }()
	var a addrs
	select {
	case a = <-readyc:
	case err := <-errc:
		cancel()
		t.Fatalf("run: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("the sidecar did not start within 10s")
	}
	stopped := false
	var runErr error
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			runErr = <-errc
		}
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return a, stop
}

// grpcurl returns the path of grpcurl: in PATH, in GOPATH/bin, or installed with go install into a
// cache directory. Without it the test is skipped, or fails when CI is "true".
func grpcurl(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	gopath, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		if p := filepath.Join(strings.TrimSpace(string(gopath)), "bin", "grpcurl"); fileExists(p) {
			return p
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "hybridrate-tools")
	if p := filepath.Join(bin, "grpcurl"); fileExists(p) {
		return p
	}
	t.Logf("installing grpcurl into %s", bin)
	cmd := exec.Command("go", "install", "github.com/fullstorydev/grpcurl/cmd/grpcurl@latest")
	cmd.Env = append(os.Environ(), "GOBIN="+bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		msg := "grpcurl is not installed and `go install github.com/fullstorydev/grpcurl/cmd/grpcurl@latest` failed: " +
			err.Error() + "\n" + string(out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return filepath.Join(bin, "grpcurl")
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

const testPolicy = `
version: 1
missing_key: skip
rules:
  - id: per-key
    dimensions: [api_key]
    limit: 3
    period: 1m
  - id: per-ip
    dimensions: [ip]
    rate: 1000
    burst: 1000
`

func writePolicy(t testing.TB, dir, content string) string {
	t.Helper()
	p := filepath.Join(dir, "policy.yaml")
	tmp := p + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(content), 0o644))
	require.NoError(t, os.Rename(tmp, p))
	return p
}

// rlsResponse is grpcurl's JSON output of a RateLimitResponse.
type rlsResponse struct {
	OverallCode string `json:"overallCode"`
	Statuses    []struct {
		Code         string `json:"code"`
		CurrentLimit struct {
			RequestsPerUnit int    `json:"requestsPerUnit"`
			Unit            string `json:"unit"`
			Name            string `json:"name"`
		} `json:"currentLimit"`
		LimitRemaining int `json:"limitRemaining"`
	} `json:"statuses"`
	ResponseHeadersToAdd []struct{ Key, Value string } `json:"responseHeadersToAdd"`
}

func (r *rlsResponse) header(k string) string {
	for _, h := range r.ResponseHeadersToAdd {
		if h.Key == k {
			return h.Value
		}
	}
	return ""
}

// TestGRPCurlShouldRateLimit asks the sidecar, backed by a real redis-server, with grpcurl: a client
// this project did not write, that learns the API by server reflection.
func TestGRPCurlShouldRateLimit(t *testing.T) {
	bin := grpcurl(t)
	srv := redistest.Start(t)
	a, stop := start(t, config{redisAddr: srv.Addr, policyPath: writePolicy(t, t.TempDir(), testPolicy)})
	call := func(body string) rlsResponse {
		t.Helper()
		cmd := exec.Command(bin, "-plaintext", "-d", body, a.grpc, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "grpcurl: %s", out)
		var r rlsResponse
		require.NoError(t, json.Unmarshal(out, &r), "%s", out)
		return r
	}
	body := `{"domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":"grpcurl-key"}]},` +
		`{"entries":[{"key":"remote_address","value":"192.0.2.7"}]}]}`
	for i := 0; i < 3; i++ {
		r := call(body)
		assert.Equal(t, "OK", r.OverallCode, "call %d", i)
		require.Len(t, r.Statuses, 2)
		assert.Equal(t, "OK", r.Statuses[0].Code)
		assert.Equal(t, 3, r.Statuses[0].CurrentLimit.RequestsPerUnit)
		assert.Equal(t, "MINUTE", r.Statuses[0].CurrentLimit.Unit)
		assert.Equal(t, 2-i, r.Statuses[0].LimitRemaining)
		assert.Equal(t, "3", r.header("X-RateLimit-Limit"))
		assert.Equal(t, "", r.header("Retry-After"))
	}
	r := call(body)
	assert.Equal(t, "OVER_LIMIT", r.OverallCode)
	assert.Equal(t, "OVER_LIMIT", r.Statuses[0].Code)
	assert.Equal(t, "OK", r.Statuses[1].Code)
	assert.Equal(t, "0", r.header("X-RateLimit-Remaining"))
	assert.NotEmpty(t, r.header("Retry-After"))

	// grpc.health.v1 answers too.
	out, err := exec.Command(bin, "-plaintext", a.grpc, "grpc.health.v1.Health/Check").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "SERVING")
	require.NoError(t, stop())
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestHTTPEndpointsOnTheEmbeddedRedis(t *testing.T) {
	a, stop := start(t, config{}) // no -redis, no -policy: miniredis and the built-in policy
	base := "http://" + a.http
	code, body := get(t, base+"/healthz")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok\n", body)
	code, _ = get(t, base+"/readyz")
	assert.Equal(t, http.StatusOK, code)
	denied := 0
	for i := 0; i < 30; i++ { // per-key: burst 20, then 10/s (a slow run may refill a token or two)
		resp, err := http.Post(base+"/v1/check", "application/json",
			strings.NewReader(`{"descriptors":[{"entries":[{"key":"api_key","value":"http-key"}]}]}`))
		require.NoError(t, err)
		resp.Body.Close()
		if i < 20 {
			assert.Equal(t, http.StatusOK, resp.StatusCode, "request %d", i)
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			denied++
		}
	}
	require.Positive(t, denied, "past the burst")
	code, body = get(t, base+"/metrics")
	assert.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		`hybridrate_requests_total{hybridrate_instance=`,
		`outcome="denied"`,
		`hybridrate_rule_decisions_total{`,
		`hybridrate_check_duration_seconds_bucket{`,
		`hybridrate_sidecar_requests_total{api="http",code="OVER_LIMIT"`,
		`hybridrate_breaker_state{`,
		`hybridrate_sync_flushes_total{`,
	} {
		assert.Contains(t, body, want)
	}
	code, body = get(t, base+"/dashboard/")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "<svg id=\"chart\"")
	code, body = get(t, base+"/dashboard/api/snapshot?span=60")
	assert.Equal(t, http.StatusOK, code)
	var snap struct {
		Sum struct{ Denied int64 } `json:"sum"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &snap))
	assert.EqualValues(t, denied, snap.Sum.Denied)
	require.NoError(t, stop())
}

func TestPolicyHotReload(t *testing.T) {
	dir := t.TempDir()
	path := writePolicy(t, dir, testPolicy)
	a, _ := start(t, config{policyPath: path})
	check := func(key string) int {
		resp, err := http.Post("http://"+a.http+"/v1/check", "application/json",
			strings.NewReader(`{"descriptors":[{"entries":[{"key":"api_key","value":"`+key+`"}]}]}`))
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := 0; i < 3; i++ {
		require.Equal(t, http.StatusOK, check("a"))
	}
	require.Equal(t, http.StatusTooManyRequests, check("a"))
	writePolicy(t, dir, strings.Replace(testPolicy, "limit: 3", "limit: 1", 1))
	// A fresh key each try: on a loaded machine a check can time out into the failure policy, which
	// must not spoil the next try.
	try := 0
	require.Eventually(t, func() bool {
		try++
		k := "b" + strconv.Itoa(try)
		return check(k) == http.StatusOK && check(k) == http.StatusTooManyRequests
	}, 15*time.Second, 20*time.Millisecond, "the new limit of 1 takes effect")
	writePolicy(t, dir, "rules: [") // invalid: rejected, the previous policy stays
	time.Sleep(50 * time.Millisecond)
	require.Eventually(t, func() bool {
		try++
		k := "c" + strconv.Itoa(try)
		return check(k) == http.StatusOK && check(k) == http.StatusTooManyRequests
	}, 15*time.Second, 20*time.Millisecond, "the limit of 1 stays")
}

// TestShutdownFlushesPendingConsumption: consumption decided locally and not yet reconciled reaches
// Redis before run returns.
func TestShutdownFlushesPendingConsumption(t *testing.T) {
	mr := miniredis.RunT(t)
	const pol = `
version: 1
missing_key: skip
rules:
  - id: per-key
    dimensions: [api_key]
    rate: 0.001
    burst: 1000
`
	path := writePolicy(t, t.TempDir(), pol)
	a, stop := start(t, config{redisAddr: mr.Addr(), policyPath: path, checkTimeout: time.Second})
	const n = 200
	for i := 0; i < n; i++ {
		resp, err := http.Post("http://"+a.http+"/v1/check", "application/json",
			strings.NewReader(`{"descriptors":[{"entries":[{"key":"api_key","value":"flush-key"}]}]}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.NoError(t, stop())

	// Redis's own accounting of the bucket: every admitted token is there once run has returned.
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	names, err := rdb.Keys(ctx, hybrid.DefaultKeyPrefix+":"+central.Version+":b:{per-key:api_key=flush-key}*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, names, "the key's bucket is in Redis")
	var total int64
	for _, name := range names {
		b, err := rdb.HGet(ctx, name, central.BucketField).Result()
		require.NoError(t, err)
		st, err := central.ParseBucket(b)
		require.NoError(t, err)
		total += st.Consumed
	}
	assert.EqualValues(t, n, total, "every admitted token was applied to Redis")
}

func TestParseConfig(t *testing.T) {
	env := map[string]string{"HYBRIDRATED_REDIS": "10.0.0.5:6379", "HYBRIDRATED_POLICY": "p.yaml", "HYBRIDRATED_RELOAD": "5s", "HYBRIDRATED_HASH_KEY": "s3cret"}
	c, err := parseConfig([]string{"-grpc", ":9000"}, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, ":9000", c.grpcAddr)
	assert.Equal(t, "127.0.0.1:8080", c.httpAddr)
	assert.Equal(t, "10.0.0.5:6379", c.redisAddr)
	assert.Equal(t, 5*time.Second, c.reload)
	assert.Equal(t, []byte("s3cret"), c.hashKey)
	_, err = parseConfig([]string{"-sentinel-master", "m"}, func(string) string { return "" }, io.Discard)
	assert.Error(t, err, "sentinels need addresses")
	_, err = parseConfig([]string{"-reload", "0s"}, func(string) string { return "" }, io.Discard)
	assert.Error(t, err)
	_, err = parseConfig([]string{"stray"}, func(string) string { return "" }, io.Discard)
	assert.Error(t, err)
	_, err = parseConfig(nil, func(k string) string { return map[string]string{"HYBRIDRATED_RELOAD": "soon"}[k] }, io.Discard)
	assert.Error(t, err)
	none := func(string) string { return "" }
	c, err = parseConfig([]string{"-check-timeout", "30ms"}, none, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 30*time.Millisecond, c.checkTimeout)
	_, err = parseConfig([]string{"-sync-timeout", "40ms"}, none, io.Discard)
	assert.Error(t, err, "the former name is gone")
	_, err = parseConfig([]string{"-check-timeout", "-1s"}, none, io.Discard)
	assert.Error(t, err)
	c, err = parseConfig(nil, none, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, hybrid.DefaultMaxKeys, c.maxKeys)
	assert.Equal(t, hybrid.DefaultIdleEviction, c.idleEviction)
	c, err = parseConfig([]string{"-max-keys", "100000", "-idle-eviction", "0s"}, none, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 100000, c.maxKeys)
	assert.Zero(t, c.idleEviction)
	c, err = parseConfig(nil, func(k string) string { return map[string]string{"HYBRIDRATED_MAX_KEYS": "5000"}[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 5000, c.maxKeys)
	for _, bad := range [][]string{{"-max-keys", "10"}, {"-idle-eviction", "-1m"}} {
		_, err = parseConfig(bad, none, io.Discard)
		assert.Error(t, err, bad)
	}
	_, err = parseConfig(nil, func(k string) string { return map[string]string{"HYBRIDRATED_MAX_KEYS": "many"}[k] }, io.Discard)
	assert.Error(t, err)
}

// TestRedisWithoutPolicyNeedsDemo: -redis without -policy enforced the built-in example policy with
// one INFO line (issue 23); it is now an error unless -demo asks for it.
func TestRedisWithoutPolicyNeedsDemo(t *testing.T) {
	none := func(string) string { return "" }
	_, err := parseConfig([]string{"-redis", "10.0.0.5:6379"}, none, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-redis needs -policy FILE")
	assert.Contains(t, err.Error(), "-demo")
	c, err := parseConfig([]string{"-redis", "10.0.0.5:6379", "-demo"}, none, io.Discard)
	require.NoError(t, err)
	assert.True(t, c.demo)
	c, err = parseConfig(nil, func(k string) string {
		return map[string]string{"HYBRIDRATED_REDIS": "10.0.0.5:6379", "HYBRIDRATED_DEMO": "true"}[k]
	}, io.Discard)
	require.NoError(t, err)
	assert.True(t, c.demo)
	_, err = parseConfig([]string{"-redis", "10.0.0.5:6379", "-policy", "p.yaml"}, none, io.Discard)
	assert.NoError(t, err)
	_, err = parseConfig(nil, none, io.Discard)
	assert.NoError(t, err, "the embedded Redis keeps the built-in policy: nothing real is limited")
	_, err = parseConfig([]string{"-demo", "-policy", "p.yaml"}, none, io.Discard)
	assert.Error(t, err)
}

// TestPrometheusExampleUsesExportedMetrics: every hybridrate metric that examples/prometheus names
// (alert rules and Grafana dashboard) is one the sidecar serves at /metrics, and every alert of
// docs/operations.md has a rule.
func TestPrometheusExampleUsesExportedMetrics(t *testing.T) {
	const pol = `
version: 1
missing_key: skip
rules:
  - id: per-key
    dimensions: [api_key]
    limit: 3
    period: 1m
  - id: trial
    dimensions: [api_key]
    limit: 1
    period: 1m
    shadow: true
`
	a, stop := start(t, config{policyPath: writePolicy(t, t.TempDir(), pol)})
	for i := 0; i < 5; i++ { // admitted, near the limit, denied, shadow-denied
		resp, err := http.Post("http://"+a.http+"/v1/check", "application/json",
			strings.NewReader(`{"descriptors":[{"entries":[{"key":"api_key","value":"k"}]}]}`))
		require.NoError(t, err)
		resp.Body.Close()
	}
	_, metrics := get(t, "http://"+a.http+"/metrics")
	require.NoError(t, stop())

	exported := map[string]bool{}
	for _, line := range strings.Split(metrics, "\n") {
		if name, _, ok := strings.Cut(line, "{"); ok && strings.HasPrefix(name, "hybridrate_") {
			exported[name] = true
		}
	}
	named := map[string]bool{}
	for _, f := range []string{"alerts.yml", "grafana-dashboard.json"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "examples", "prometheus", f))
		require.NoError(t, err)
		for _, m := range metricName.FindAllString(string(b), -1) {
			named[m] = true
		}
	}
	require.NotEmpty(t, named)
	for m := range named {
		if strings.Contains(metrics, ","+m+"=") || strings.Contains(metrics, "{"+m+"=") {
			continue // a label, not a metric
		}
		assert.True(t, exported[m], "examples/prometheus names %s, which the sidecar does not export", m)
	}

	// docs/operations.md's alerts, each with a rule on its metric.
	alerts, err := os.ReadFile(filepath.Join("..", "..", "examples", "prometheus", "alerts.yml"))
	require.NoError(t, err)
	for _, m := range []string{"hybridrate_breaker_open", "hybridrate_breaker_checks_open", "hybridrate_redis_errors_total", "hybridrate_pending",
		"hybridrate_sync_failed_keys_total", `hybridrate_decisions_total{source="fallback"}`, "hybridrate_evictions_total"} {
		assert.Contains(t, string(alerts), m)
	}
}

var metricName = regexp.MustCompile(`hybridrate_[a-z_]+[a-z]`)

// TestOnRedisCluster: with several -redis addresses the sidecar runs on a Redis Cluster.
func TestOnRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a 3-node cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	var addrs []string
	for _, n := range cl.Nodes() {
		addrs = append(addrs, n.Addr)
	}
	// A generous check timeout: on a loaded machine a timed-out check goes to the failure policy, which
	// may admit (this test is about the cluster, not about timeouts).
	a, stop := start(t, config{redisAddr: strings.Join(addrs, ","), policyPath: writePolicy(t, t.TempDir(), testPolicy),
		checkTimeout: time.Second})
	codes := map[int]int{}
	for i := 0; i < 5; i++ {
		resp, err := http.Post("http://"+a.http+"/v1/check", "application/json",
			strings.NewReader(`{"descriptors":[{"entries":[{"key":"api_key","value":"cluster-key"}]}]}`))
		require.NoError(t, err)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	assert.Equal(t, map[int]int{http.StatusOK: 3, http.StatusTooManyRequests: 2}, codes)
	require.NoError(t, stop())
}

// TestFleetAndDashboardFlags: the fleet report's interval, the reveal map's size and the dashboard's
// shared hash key, from flags or the environment.
func TestFleetAndDashboardFlags(t *testing.T) {
	none := func(string) string { return "" }
	c, err := parseConfig(nil, none, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 5*time.Second, c.fleetInterval, "the default")
	assert.Zero(t, c.revealSubjects, "off by default")
	assert.Nil(t, c.dashboardKey, "a random key per process")
	env := map[string]string{"HYBRIDRATED_HASH_KEY": "redis-key", "HYBRIDRATED_DASHBOARD_REVEAL": "500", "HYBRIDRATED_FLEET_INTERVAL": "0s"}
	c, err = parseConfig(nil, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Zero(t, c.fleetInterval, "0: no report, no fleet view")
	assert.Equal(t, 500, c.revealSubjects)
	assert.Equal(t, []byte("redis-key"), c.dashboardKey, "HYBRIDRATED_HASH_KEY when no dashboard key is given")
	env["HYBRIDRATED_DASHBOARD_HASH_KEY"] = "dash-key"
	c, err = parseConfig(nil, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []byte("dash-key"), c.dashboardKey)
	file := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(file, []byte("file-key\n"), 0o600))
	c, err = parseConfig([]string{"-dashboard-hash-key-file", file, "-dashboard-reveal", "7", "-fleet-interval", "2s"},
		func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []byte("file-key"), c.dashboardKey, "the file wins, trimmed")
	assert.Equal(t, 7, c.revealSubjects)
	assert.Equal(t, 2*time.Second, c.fleetInterval)
	for _, args := range [][]string{
		{"-dashboard-reveal", "-1"}, {"-dashboard-reveal", "many"}, {"-fleet-interval", "10ms"},
		{"-dashboard-hash-key-file", filepath.Join(t.TempDir(), "missing")},
	} {
		_, err := parseConfig(args, none, io.Discard)
		assert.Error(t, err, "%q", args)
	}
}
