// Command hybridrated is hybridrate as a sidecar, for services not written in Go: Envoy's
// rate-limit service (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over gRPC, the
// same check as JSON over HTTP, Prometheus metrics, health and readiness endpoints and a live deny
// dashboard, all answered by the same policy file and packages a Go service would use.
//
//	go run ./cmd/hybridrated                     # embedded Redis (miniredis) and the built-in policy
//	hybridrated -redis 10.0.0.5:6379 -policy policy.yaml
//	hybridrated -redis 10.0.0.5:6379 -demo       # the built-in policy on a real Redis, on purpose
//
// With -redis, -policy is required: the built-in example policy is enforced on a real Redis only
// when -demo asks for it.
//
// Endpoints (the addresses are flags):
//
//	gRPC  127.0.0.1:8081  envoy.service.ratelimit.v3.RateLimitService, grpc.health.v1.Health, reflection
//	HTTP  127.0.0.1:8080  POST /v1/check (JSON), GET /metrics (Prometheus), /healthz, /readyz,
//	                      /dashboard/ (live denials)
//
// Started with envoyproxy/ratelimit's environment (RUNTIME_ROOT, REDIS_URL, ...) and no command
// line, it serves upstream's configuration directory on upstream's ports and answers as upstream
// does (compat.go; docs/sidecar.md, "Migrating from envoyproxy/ratelimit").
//
// Every flag can also be set in the environment: -redis as HYBRIDRATED_REDIS, -redis-tls as
// HYBRIDRATED_REDIS_TLS=true, and so on. Several -redis addresses are a Redis Cluster (or Sentinels,
// with -sentinel-master). -redis-user names a Redis ACL user; -redis-tls (and -redis-tls-ca,
// -redis-tls-cert, -redis-tls-key, -redis-tls-server-name) connect over TLS. Secrets come from the
// environment only: the Redis password from HYBRIDRATED_REDIS_PASSWORD, and the HMAC key that hashes
// keys before they reach Redis from HYBRIDRATED_HASH_KEY. Logs go to stderr at -log-level (debug,
// info, warn, error), as text or, with -log-format json, JSON. -relay also serves leases to the
// limiters of other processes (package relay, at /hybridrate/relay/v1 on the HTTP address), and
// -upstream URL makes this one's hybrid rules take their leases from such a relay instead of Redis;
// several comma-separated URLs shard the keys over those relays, each key to one of them
// (relay.Sharded; every process must list the same URLs) (docs/operations.md, "Relays").
//
// A changed policy file takes effect within -reload, or at once on SIGHUP; an invalid one is logged
// with its line and the previous policy stays. Reloads are counted (hybridrate.policy.reloads, by
// result) and /readyz's body reports the last one. On SIGINT or SIGTERM the sidecar turns unready
// (/readyz 503, gRPC health NOT_SERVING) and keeps serving for -shutdown-grace (5s), so load
// balancers stop sending, then lets in-flight calls finish, flushes the consumption not yet applied
// to Redis and exits.
//
// Exit status: 0 after a clean shutdown, 1 when it cannot start or stop cleanly, 2 for a bad
// command line.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/observe"
	"github.com/hybridrate/hybridrate/relay"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills the process the usual way
	}()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP) // reload the policy file; never the default (exit)
	redis.SetLogger(quietLogger{})     // until the logger is set up: go-redis would print every failed dial
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hybridrated: %v\n", err)
		os.Exit(2)
	}
	cfg.hup = hup
	if os.Getenv("GOGC") == "" {
		go tuneGC(ctx, time.Second, liveHeap, debug.SetGCPercent) // a small heap collected less often
	}
	log := newLogger(cfg, os.Stderr)
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
	grpcAddr        string           // gRPC listen address
	httpAddr        string           // HTTP listen address
	redisAddr       string           // Redis address(es); empty: embedded miniredis
	sentinelMaster  string           // Sentinel master name; the addresses are then Sentinels
	redisPassword   string           // from the environment
	policyPath      string           // policy file; empty: the built-in one (with -demo, or on the embedded Redis)
	demo            bool             // enforce the built-in example policy on -redis
	instance        string           // the metrics' instance label; empty: the host name
	reload          time.Duration    // how often the policy file is read
	shutdownTimeout time.Duration    // bound on the graceful shutdown
	checkTimeout    time.Duration    // the hybrid limiters' synchronous Redis check bound; 0: default
	maxKeys         int              // the hybrid limiters' local key cap (hybrid.WithMaxKeys)
	idleEviction    time.Duration    // hybrid.WithIdleEviction; 0: off
	hashKey         []byte           // HMAC key for keys in Redis, from the environment
	shutdownGrace   time.Duration    // how long to keep serving, unready, after SIGTERM
	logLevel        slog.Level       // -log-level
	logJSON         bool             // -log-format json
	redisUser       string           // Redis ACL user name
	redisTLS        bool             // connect to Redis over TLS
	redisTLSCA      string           // PEM file of the CAs that sign Redis's certificate; empty: the system's
	redisTLSCert    string           // PEM client certificate, for Redis's tls-auth-clients
	redisTLSKey     string           // its key
	redisTLSServer  string           // the server name to verify; empty: the host of the address
	relay           bool             // also serve as a relay (package relay) at relay.Path on the HTTP address
	relayOwner      bool             // the relay's children shard keys over the relays: cold credit for new keys
	upstream        string           // the hybrid rules take their leases from the relay at this URL
	fleetInterval   time.Duration    // how often this instance's fleet report is written to Redis; 0: none
	revealSubjects  int              // denied subjects whose readable values the dashboard keeps; 0: none
	dashboardKey    []byte           // HMAC key of the dashboard's subject ids; nil: hashKey, else random
	hup             <-chan os.Signal // SIGHUP: reload the policy file now; nil in tests that do not send it
	compat          *compat          // envoyproxy/ratelimit's start-up (compat.go); nil: the native one
}

// newLogger returns the logger -log-level and -log-format ask for, writing to w.
func newLogger(c config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.logLevel}
	if c.logJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// tlsConfig returns the TLS configuration of the Redis connections, or nil without -redis-tls (a
// CA, a client certificate or a server name implies it).
func (c config) tlsConfig() (*tls.Config, error) {
	if !c.redisTLS && c.redisTLSCA == "" && c.redisTLSCert == "" && c.redisTLSServer == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.redisTLSServer}
	if c.compat != nil && c.compat.skipVerify {
		tc.InsecureSkipVerify = true // REDIS_TLS_SKIP_HOSTNAME_VERIFICATION, as upstream does
	}
	if c.redisTLSCA != "" {
		pem, err := os.ReadFile(c.redisTLSCA)
		if err != nil {
			return nil, fmt.Errorf("-redis-tls-ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-redis-tls-ca %s: no PEM certificate in it", c.redisTLSCA)
		}
	}
	if (c.redisTLSCert == "") != (c.redisTLSKey == "") {
		return nil, errors.New("-redis-tls-cert and -redis-tls-key go together")
	}
	if c.redisTLSCert != "" {
		cert, err := tls.LoadX509KeyPair(c.redisTLSCert, c.redisTLSKey)
		if err != nil {
			return nil, fmt.Errorf("-redis-tls-cert: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// parseConfig reads flags, with defaults from the environment (HYBRIDRATED_<FLAG>).
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	if wantsCompat(args, getenv) {
		return parseCompat(getenv)
	}
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
	fs.StringVar(&c.policyPath, "policy", env("policy", ""), "policy file (YAML, or JSON by its .json name); required with -redis unless -demo")
	fs.BoolVar(&c.demo, "demo", env("demo", "") == "true", "enforce the built-in example policy (cmd/hybridrated/default.yaml); required to use it with -redis, the default without -redis")
	fs.StringVar(&c.redisUser, "redis-user", env("redis-user", ""), "Redis ACL user name (the password comes from HYBRIDRATED_REDIS_PASSWORD)")
	fs.BoolVar(&c.redisTLS, "redis-tls", env("redis-tls", "") == "true", "connect to Redis over TLS (implied by the other -redis-tls flags)")
	fs.StringVar(&c.redisTLSCA, "redis-tls-ca", env("redis-tls-ca", ""), "PEM file of the CA certificates that sign Redis's; empty: the system's")
	fs.StringVar(&c.redisTLSCert, "redis-tls-cert", env("redis-tls-cert", ""), "PEM client certificate for Redis (tls-auth-clients), with -redis-tls-key")
	fs.StringVar(&c.redisTLSKey, "redis-tls-key", env("redis-tls-key", ""), "PEM key of -redis-tls-cert")
	fs.StringVar(&c.redisTLSServer, "redis-tls-server-name", env("redis-tls-server-name", ""), "server name to verify in Redis's certificate; empty: the address's host")
	logLevel := fs.String("log-level", env("log-level", "info"), "log level: debug, info, warn or error")
	logFormat := fs.String("log-format", env("log-format", "text"), "log format: text or json")
	fs.StringVar(&c.instance, "instance", env("instance", ""), "instance label of the metrics and of the dashboard's fleet view; empty: the host name")
	reveal := fs.String("dashboard-reveal", env("dashboard-reveal", "0"), "keep the readable values of up to this many denied subjects in memory, to show them on this instance's dashboard next to their hashed ids (never written to Redis); 0: off")
	dashKeyFile := fs.String("dashboard-hash-key-file", env("dashboard-hash-key-file", ""), "file holding the HMAC key of the dashboard's subject ids (also HYBRIDRATED_DASHBOARD_HASH_KEY); the same key on every instance gives a subject the same id fleet-wide; empty: HYBRIDRATED_HASH_KEY, else a random key per process")
	fs.BoolVar(&c.relayOwner, "relay-owner", env("relay_owner", "") == "true", "with -relay: every child sends each key to one relay (children list all relays in -upstream), so a key new to this relay is admitted once before Redis counts it (relay.WithColdCredit)")
	fs.BoolVar(&c.relay, "relay", env("relay", "") == "true", "also serve as a relay: hold leases in Redis for the limiters of other processes and hand them on at "+relay.Path+" on the HTTP address (docs/operations.md, Relays)")
	fs.StringVar(&c.upstream, "upstream", env("upstream", ""), "take the hybrid rules' leases from the relay at this `URL` (e.g. http://relay:8080) instead of Redis; several comma-separated URLs shard keys over those relays")
	var err error
	durations := []struct {
		name, def, usage string
		dst              *time.Duration
	}{
		{"reload", "1s", "how often the policy file is read for changes", &c.reload},
		{"shutdown-timeout", "10s", "bound on the graceful shutdown (drain and flush)", &c.shutdownTimeout},
		{"shutdown-grace", "5s", "after SIGTERM, how long to keep serving while /readyz reports not ready (so load balancers stop sending), before draining", &c.shutdownGrace},
		{"fleet-interval", "5s", "how often this instance writes its dashboard counters to Redis for the fleet view (one small key with a TTL); 0: never, and no fleet view", &c.fleetInterval},
		{"check-timeout", "0s", "bound on a synchronous Redis check of a hybrid rule; 0: the library default (1s on the embedded Redis)", &c.checkTimeout},
		{"idle-eviction", hybrid.DefaultIdleEviction.String(), "drop keys idle this long (up to twice as long), with nothing pending, from local memory, and give the memory back; 0: off", &c.idleEviction},
	}
	for _, d := range durations {
		v, perr := time.ParseDuration(env(d.name, d.def))
		if perr != nil {
			err = errors.Join(err, fmt.Errorf("HYBRIDRATED_%s: %w", strings.ToUpper(strings.ReplaceAll(d.name, "-", "_")), perr))
		}
		fs.DurationVar(d.dst, d.name, v, d.usage)
	}
	maxKeys, perr := strconv.Atoi(env("max-keys", strconv.Itoa(hybrid.DefaultMaxKeys)))
	if perr != nil {
		err = errors.Join(err, fmt.Errorf("HYBRIDRATED_MAX_KEYS: %w", perr))
	}
	fs.IntVar(&c.maxKeys, "max-keys", maxKeys, "cap on the keys each hybrid limiter holds in local memory (at least 64); about 145 bytes of heap each (and the key string; about 143 more once reconciled and while a key holds a lease), so 152-302 MB of heap at the default, and up to twice that resident unless GOMEMLIMIT bounds it (docs/operations.md)")
	if err != nil {
		return c, err
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.reload < time.Millisecond || c.shutdownTimeout <= 0 || c.checkTimeout < 0 || c.shutdownGrace < 0 || c.idleEviction < 0 {
		return c, errors.New("-reload must be at least 1ms, -shutdown-timeout positive, -check-timeout, -shutdown-grace and -idle-eviction not negative")
	}
	if c.maxKeys < 64 {
		return c, fmt.Errorf("-max-keys %d: want at least 64", c.maxKeys)
	}
	if c.relayOwner && !c.relay {
		return c, errors.New("-relay-owner needs -relay (it sets the relay's cold credit)")
	}
	if c.fleetInterval != 0 && c.fleetInterval < 100*time.Millisecond {
		return c, fmt.Errorf("-fleet-interval %v: want 0 (off) or at least 100ms", c.fleetInterval)
	}
	n, err := strconv.Atoi(*reveal)
	if err != nil || n < 0 || n > observe.MaxRevealSubjects {
		return c, fmt.Errorf("-dashboard-reveal %q: want a count from 0 to %d", *reveal, observe.MaxRevealSubjects)
	}
	c.revealSubjects = n
	if err := c.logLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		return c, fmt.Errorf("-log-level %q: want debug, info, warn or error", *logLevel)
	}
	switch *logFormat {
	case "text":
	case "json":
		c.logJSON = true
	default:
		return c, fmt.Errorf("-log-format %q: want text or json", *logFormat)
	}
	for _, b := range []struct {
		name string
		v    *bool
	}{{"demo", &c.demo}, {"redis-tls", &c.redisTLS}} {
		if s := env(b.name, ""); s != "" && s != "true" && s != "false" {
			return c, fmt.Errorf("HYBRIDRATED_%s %q: want true or false", strings.ToUpper(strings.ReplaceAll(b.name, "-", "_")), s)
		}
	}
	if _, err := c.tlsConfig(); err != nil {
		return c, err
	}
	c.redisPassword = getenv("HYBRIDRATED_REDIS_PASSWORD")
	switch {
	case c.demo && c.policyPath != "":
		return c, errors.New("-demo and -policy exclude each other: -demo enforces the built-in example policy")
	case c.redisAddr != "" && c.policyPath == "" && !c.demo:
		return c, errors.New("-redis needs -policy FILE: without one the sidecar would enforce the built-in example " +
			"policy (10/s per api_key) on your traffic; pass -demo to do that on purpose")
	}
	if c.sentinelMaster != "" && c.redisAddr == "" {
		return c, errors.New("-sentinel-master needs -redis with the Sentinels' addresses")
	}
	if k := getenv("HYBRIDRATED_HASH_KEY"); k != "" {
		c.hashKey = []byte(k)
	}
	switch {
	case *dashKeyFile != "":
		b, err := os.ReadFile(*dashKeyFile)
		if err != nil {
			return c, fmt.Errorf("-dashboard-hash-key-file: %w", err)
		}
		if b = bytes.TrimSpace(b); len(b) == 0 {
			return c, fmt.Errorf("-dashboard-hash-key-file %s is empty", *dashKeyFile)
		}
		c.dashboardKey = b
	case getenv("HYBRIDRATED_DASHBOARD_HASH_KEY") != "":
		c.dashboardKey = []byte(getenv("HYBRIDRATED_DASHBOARD_HASH_KEY"))
	default:
		c.dashboardKey = c.hashKey
	}
	return c, nil
}
