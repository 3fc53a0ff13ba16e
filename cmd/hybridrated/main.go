// Command hybridrated is hybridrate as a sidecar, for services not written in Go: Envoy's
// rate-limit service (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over gRPC, the
// same check as JSON over HTTP, Prometheus metrics, health and readiness endpoints and a live deny
// dashboard, all answered by the same policy file and packages a Go service would use.
//
//	go run ./cmd/hybridrated                     # embedded Redis (miniredis) and the built-in policy
//	hybridrated -redis 10.0.0.5:6379 -policy policy.yaml
//
// Endpoints (the addresses are flags):
//
//	gRPC  127.0.0.1:8081  envoy.service.ratelimit.v3.RateLimitService, grpc.health.v1.Health, reflection
//	HTTP  127.0.0.1:8080  POST /v1/check (JSON), GET /metrics (Prometheus), /healthz, /readyz,
//	                      /dashboard/ (live denials)
//
// Every flag can also be set in the environment: -redis as HYBRIDRATED_REDIS, and so on. Several
// -redis addresses are a Redis Cluster (or Sentinels, with -sentinel-master). Secrets come from the
// environment only: the Redis password from HYBRIDRATED_REDIS_PASSWORD, and the HMAC key that hashes
// keys before they reach Redis from HYBRIDRATED_HASH_KEY. A changed
// policy file takes effect within -reload; an invalid one is logged with its line and the previous
// policy stays. On SIGINT or SIGTERM the sidecar turns unready, lets in-flight calls finish, flushes
// the consumption not yet applied to Redis and exits.
//
// Exit status: 0 after a clean shutdown, 1 when it cannot start or stop cleanly, 2 for a bad
// command line.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills the process the usual way
	}()
	redis.SetLogger(quietLogger{}) // until the logger is set up: go-redis would print every failed dial
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hybridrated: %v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// go-redis's own lines (failed dials while Redis is down) through our log, one per 10s at most.
	redis.SetLogger(hybrid.NewRedisLog(log, 10*time.Second))
	if err := run(ctx, cfg, log, nil); err != nil {
		log.Error("hybridrated stopped", "err", err)
		os.Exit(1)
	}
}

// quietLogger drops go-redis's internal log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// config is the command line.
type config struct {
	grpcAddr        string        // gRPC listen address
	httpAddr        string        // HTTP listen address
	redisAddr       string        // Redis address(es); empty: embedded miniredis
	sentinelMaster  string        // Sentinel master name; the addresses are then Sentinels
	redisPassword   string        // from the environment
	policyPath      string        // policy file; empty: the built-in one
	instance        string        // the metrics' instance label; empty: the host name
	reload          time.Duration // how often the policy file is read
	shutdownTimeout time.Duration // bound on the graceful shutdown
	checkTimeout    time.Duration // the hybrid limiters' synchronous Redis check bound; 0: default
	syncTimeout     time.Duration // the deprecated name of checkTimeout (-sync-timeout)
	hashKey         []byte        // HMAC key for keys in Redis, from the environment
}

// parseConfig reads flags, with defaults from the environment (HYBRIDRATED_<FLAG>).
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("hybridrated", flag.ContinueOnError)
	fs.SetOutput(stderr)
	env := func(name, def string) string {
		if v := getenv("HYBRIDRATED_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))); v != "" {
			return v
		}
		return def
	}
	fs.StringVar(&c.grpcAddr, "grpc", env("grpc", "127.0.0.1:8081"), "gRPC listen address (Envoy's rate-limit service)")
	fs.StringVar(&c.httpAddr, "http", env("http", "127.0.0.1:8080"), "HTTP listen address (/v1/check, /metrics, /healthz, /readyz, /dashboard/)")
	fs.StringVar(&c.redisAddr, "redis", env("redis", ""), "Redis address host:port (several, comma-separated: a Cluster's nodes, or Sentinels with -sentinel-master); empty: an embedded in-memory Redis (miniredis), per process")
	fs.StringVar(&c.sentinelMaster, "sentinel-master", env("sentinel-master", ""), "Sentinel master name: -redis lists Sentinels")
	fs.StringVar(&c.policyPath, "policy", env("policy", ""), "policy file (YAML, or JSON by its .json name); empty: the built-in example policy")
	fs.StringVar(&c.instance, "instance", env("instance", ""), "instance label of the metrics; empty: the host name")
	var err error
	durations := []struct {
		name, def, usage string
		dst              *time.Duration
	}{
		{"reload", "1s", "how often the policy file is read for changes", &c.reload},
		{"shutdown-timeout", "10s", "bound on the graceful shutdown (drain and flush)", &c.shutdownTimeout},
		{"check-timeout", "0s", "bound on a synchronous Redis check of a hybrid rule; 0: the library default (1s on the embedded Redis)", &c.checkTimeout},
		{"sync-timeout", "0s", "deprecated: -check-timeout", &c.syncTimeout},
	}
	for _, d := range durations {
		v, perr := time.ParseDuration(env(d.name, d.def))
		if perr != nil {
			err = errors.Join(err, fmt.Errorf("HYBRIDRATED_%s: %w", strings.ToUpper(strings.ReplaceAll(d.name, "-", "_")), perr))
		}
		fs.DurationVar(d.dst, d.name, v, d.usage)
	}
	if err != nil {
		return c, err
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.checkTimeout == 0 {
		c.checkTimeout = c.syncTimeout
	}
	if c.reload < time.Millisecond || c.shutdownTimeout <= 0 || c.checkTimeout < 0 {
		return c, errors.New("-reload must be at least 1ms, -shutdown-timeout positive, -check-timeout not negative")
	}
	c.redisPassword = getenv("HYBRIDRATED_REDIS_PASSWORD")
	if c.sentinelMaster != "" && c.redisAddr == "" {
		return c, errors.New("-sentinel-master needs -redis with the Sentinels' addresses")
	}
	if k := getenv("HYBRIDRATED_HASH_KEY"); k != "" {
		c.hashKey = []byte(k)
	}
	return c, nil
}
