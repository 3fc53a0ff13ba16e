package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/policy"
)

func TestCompatReadsUpstreamsEnvironment(t *testing.T) {
	env := map[string]string{
		"RUNTIME_ROOT": "/srv/rt", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true",
		"MERGE_DOMAIN_CONFIG": "true", "PORT": "9080", "GRPC_PORT": "9081", "DEBUG_PORT": "9070",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,s1:26379,s2:26379",
		"REDIS_AUTH": "alice:secret", "REDIS_POOL_SIZE": "32", "CACHE_KEY_PREFIX": "rl_",
		"SHADOW_MODE": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_REMAINING_HEADER": "X-Left",
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":9191", "LOG_LEVEL": "debug", "LOG_FORMAT": "json",
		"USE_STATSD": "true", "LOCAL_CACHE_SIZE_IN_BYTES": "1000", "REDIS_PIPELINE_WINDOW": "150us",
		"MEMCACHE_HOST_PORT": "m:11211", "BACKEND_TYPE": "memcache",
	}
	c, err := parseConfig(nil, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	require.NotNil(t, c.compat)
	require.Equal(t, "/srv/rt/ratelimit/config", c.compat.configDir)
	require.True(t, c.compat.ignoreDot)
	require.True(t, c.compat.merge)
	require.True(t, c.compat.shadow)
	require.Equal(t, "0.0.0.0:9080", c.httpAddr)
	require.Equal(t, "0.0.0.0:9081", c.grpcAddr)
	require.Equal(t, "0.0.0.0:9070", c.compat.debugAddr)
	require.Equal(t, ":9191", c.compat.promAddr)
	require.Equal(t, "mymaster", c.sentinelMaster)
	require.Equal(t, "s1:26379,s2:26379", c.redisAddr)
	require.Equal(t, "alice", c.redisUser)
	require.Equal(t, "secret", c.redisPassword)
	require.Equal(t, 32, c.compat.poolSize)
	require.Equal(t, 10*time.Second, c.compat.timeout, "upstream's default REDIS_TIMEOUT")
	require.Equal(t, "tcp", c.compat.network)
	require.Equal(t, "rl_"+hybrid.DefaultKeyPrefix, c.compat.keyPrefix())
	require.Equal(t, "X-Left", c.compat.headers.Remaining)
	require.Equal(t, "RateLimit-Limit", c.compat.headers.Limit)
	require.True(t, c.logJSON)
	ignored := strings.Join(c.compat.ignored, "\n")
	for _, k := range []string{"USE_STATSD", "LOCAL_CACHE_SIZE_IN_BYTES", "REDIS_PIPELINE_WINDOW", "MEMCACHE_HOST_PORT", "BACKEND_TYPE=memcache"} {
		require.Contains(t, ignored, k)
	}

	// A password alone, the defaults, and the native command line winning over the environment.
	c, err = parseConfig(nil, func(k string) string { return map[string]string{"REDIS_URL": "r:6379", "REDIS_AUTH": "pw"}[k] }, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "pw", c.redisPassword)
	require.Empty(t, c.redisUser)
	require.Equal(t, "unix", c.compat.network, "upstream's default socket type")
	require.Equal(t, "/srv/runtime_data/current/config", c.compat.configDir)
	c, err = parseConfig([]string{"-demo"}, func(k string) string { return map[string]string{"REDIS_URL": "r:6379"}[k] }, io.Discard)
	require.NoError(t, err)
	require.Nil(t, c.compat)

	c, err = parseConfig(nil, func(k string) string { return map[string]string{"REDIS_URL": "a:1", "REDIS_TYPE": "cluster"}[k] }, io.Discard)
	require.NoError(t, err)
	require.True(t, c.compat.cluster, "one address is a Cluster's seed when REDIS_TYPE says so")
	_, err = parseConfig(nil, func(k string) string { return map[string]string{"REDIS_URL": "r", "REDIS_TYPE": "ring"}[k] }, io.Discard)
	require.ErrorContains(t, err, "REDIS_TYPE")

	c, err = parseConfig(nil, func(k string) string {
		return map[string]string{"REDIS_URL": "r", "HYBRIDRATED_ALGORITHM": "hybrid", "NEAR_LIMIT_RATIO": "0.5",
			"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"}[k]
	}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, policy.Hybrid, c.compat.algorithm)
	require.Equal(t, 0.5, c.compat.nearRatio)
	require.True(t, c.compat.stopIncr)
	_, err = parseConfig(nil, func(k string) string { return map[string]string{"REDIS_URL": "r", "HYBRIDRATED_ALGORITHM": "leaky"}[k] }, io.Discard)
	require.ErrorContains(t, err, "HYBRIDRATED_ALGORITHM")
	_, err = parseConfig(nil, func(k string) string { return map[string]string{"REDIS_URL": "r", "NEAR_LIMIT_RATIO": "2"}[k] }, io.Discard)
	require.ErrorContains(t, err, "NEAR_LIMIT_RATIO")

	// Window leases: 10s by default, 0 turns them off, a negative or malformed value is refused.
	c, err = parseConfig(nil, func(k string) string { return map[string]string{"REDIS_URL": "r"}[k] }, io.Discard)
	require.NoError(t, err)
	require.Equal(t, DefaultWindowLease, c.compat.lease)
	c, err = parseConfig(nil, func(k string) string { return map[string]string{"REDIS_URL": "r", "HYBRIDRATED_WINDOW_LEASE": "0"}[k] }, io.Discard)
	require.NoError(t, err)
	require.Zero(t, c.compat.lease)
	for _, v := range []string{"-1s", "soon"} {
		_, err = parseConfig(nil, func(k string) string { return map[string]string{"REDIS_URL": "r", "HYBRIDRATED_WINDOW_LEASE": v}[k] }, io.Discard)
		require.ErrorContains(t, err, "HYBRIDRATED_WINDOW_LEASE", v)
	}
}

// TestCompatReloadsOnASymlinkSwap starts hybridrated from upstream's environment and swaps the
// runtime root's symlink, as Kubernetes updates a ConfigMap: the new limit applies.
func TestCompatReloadsOnASymlinkSwap(t *testing.T) {
	srv := redistest.Start(t)
	root := t.TempDir()
	for v, n := range map[string]string{"v1": "1", "v2": "3"} {
		dir := filepath.Join(root, v, "config")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		doc := "domain: sw\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: " + n + "}\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, "c.yaml"), []byte(doc), 0o644))
	}
	cur := filepath.Join(root, "current")
	require.NoError(t, os.Symlink(filepath.Join(root, "v1"), cur))
	env := map[string]string{"RUNTIME_ROOT": cur, "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr}
	cfg, err := parseConfig(nil, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	cfg.compat.debugAddr = "127.0.0.1:0"
	a, _ := start(t, cfg)
	c := dialRLS(t, a.grpc)
	limit := func() uint32 {
		r, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "sw", Descriptors: []*rlv3.RateLimitDescriptor{d("k", "x")}})
		require.NoError(t, err)
		return r.Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	require.Equal(t, uint32(1), limit())
	next := filepath.Join(root, "next")
	require.NoError(t, os.Symlink(filepath.Join(root, "v2"), next))
	require.NoError(t, os.Rename(next, cur))
	require.Eventually(t, func() bool { return limit() == 3 }, 5*time.Second, 20*time.Millisecond)
}
