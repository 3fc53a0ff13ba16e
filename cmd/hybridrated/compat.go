package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/every"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/sidecar"
)

// compat holds the settings of envoyproxy/ratelimit's environment (docs/sidecar.md, "Migrating
// from envoyproxy/ratelimit"): hybridrated started with upstream's environment variables and no
// command line serves upstream's configuration directory on upstream's ports.
type compat struct {
	configDir  string           // RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY
	ignoreDot  bool             // RUNTIME_IGNOREDOTFILES
	merge      bool             // MERGE_DOMAIN_CONFIG
	algorithm  policy.Algorithm // HYBRIDRATED_ALGORITHM: every limit's; empty is upstream_window
	lease      time.Duration    // HYBRIDRATED_WINDOW_LEASE: upstream windows' lease life; 0: no leases
	shadow     bool             // SHADOW_MODE
	stopIncr   bool             // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
	nearRatio  float64          // NEAR_LIMIT_RATIO (upstream's default 0.8)
	headers    *sidecar.HeaderNames
	debugAddr  string        // DEBUG_HOST:DEBUG_PORT
	promAddr   string        // PROMETHEUS_ADDR, with USE_PROMETHEUS
	prefix     string        // CACHE_KEY_PREFIX
	poolSize   int           // REDIS_POOL_SIZE
	network    string        // REDIS_SOCKET_TYPE: tcp or unix
	skipVerify bool          // REDIS_TLS_SKIP_HOSTNAME_VERIFICATION
	cluster    bool          // REDIS_TYPE=cluster
	timeout    time.Duration // REDIS_TIMEOUT: the bound of one Redis call (upstream's default 10s)
	ignored    []string      // settings accepted and ignored, with the reason, logged once at start
}

// DefaultWindowLease is HYBRIDRATED_WINDOW_LEASE's default: a lease of an upstream window lasts
// about this long at its key's demand while active (docs/sidecar.md, "Local-first windows").
const DefaultWindowLease = 10 * time.Second

// upstreamMarkers are the variables whose presence, with no command line, selects upstream's
// start-up.
var upstreamMarkers = []string{"RUNTIME_ROOT", "REDIS_URL", "REDIS_SOCKET_TYPE", "RUNTIME_SUBDIRECTORY"}

// wantsCompat reports whether hybridrated should start as envoyproxy/ratelimit does.
func wantsCompat(args []string, getenv func(string) string) bool {
	if len(args) > 0 || getenv("HYBRIDRATED_POLICY") != "" || getenv("HYBRIDRATED_REDIS") != "" {
		return false
	}
	for _, k := range upstreamMarkers {
		if getenv(k) != "" {
			return true
		}
	}
	return false
}

// ignoredSettings are upstream's settings that have no meaning here, with the reason.
var ignoredSettings = []struct{ name, why string }{
	{"USE_STATSD", "metrics are Prometheus (GET /metrics on PORT, and on PROMETHEUS_ADDR with USE_PROMETHEUS)"},
	{"STATSD_HOST", "no statsd"},
	{"STATSD_PORT", "no statsd"},
	{"USE_DOG_STATSD", "no statsd"},
	{"EXTRA_TAGS", "no statsd"},
	{"STATS_FLUSH_INTERVAL", "no statsd"},
	{"DISABLE_STATS", "no statsd"},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "denials are remembered until their window ends by the policy's own bounded memo"},
	{"REDIS_PIPELINE_WINDOW", "go-redis pools connections; there is no implicit pipelining to tune"},
	{"REDIS_PIPELINE_LIMIT", "go-redis pools connections; there is no implicit pipelining to tune"},
	{"REDIS_PERSECOND", "one Redis holds every counter"},
	{"REDIS_PERSECOND_URL", "one Redis holds every counter"},
	{"REDIS_PERSECOND_TYPE", "one Redis holds every counter"},
	{"REDIS_PERSECOND_SOCKET_TYPE", "one Redis holds every counter"},
	{"REDIS_PERSECOND_AUTH", "one Redis holds every counter"},
	{"REDIS_PERSECOND_POOL_SIZE", "one Redis holds every counter"},
	{"MEMCACHE_HOST_PORT", "counters are kept in Redis only"},
	{"MEMCACHE_SRV", "counters are kept in Redis only"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "keys expire at their window's end"},
	{"QUOTA_MODE", "quota mode is not supported: limits deny"},
	{"RESPONSE_DYNAMIC_METADATA", "no dynamic metadata in answers"},
	{"TRACING_ENABLED", "no tracing"},
	{"GRPC_MAX_CONNECTION_AGE", "gRPC's defaults apply"},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", "gRPC's defaults apply"},
	{"CONFIG_TYPE", "configuration comes from files (CONFIG_TYPE=FILE)"},
}

// parseCompat builds the configuration from upstream's environment. Unparseable values of the
// settings that matter are errors; settings that do not apply are listed in c.compat.ignored.
func parseCompat(getenv func(string) string) (config, error) {
	env := func(k, def string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return def
	}
	boolean := func(k string, def bool) (bool, error) {
		v := getenv(k)
		if v == "" {
			return def, nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("%s %q: want true or false", k, v)
		}
		return b, nil
	}
	integer := func(k string, def int) (int, error) {
		v := getenv(k)
		if v == "" {
			return def, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s %q: want a whole number", k, v)
		}
		return n, nil
	}
	cm := &compat{}
	c := config{compat: cm, reload: time.Second, shutdownTimeout: 10 * time.Second, shutdownGrace: 0}
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	port := func(k string, def int) int {
		n, err := integer(k, def)
		add(err)
		return n
	}
	c.httpAddr = joinHostPort(env("HOST", "0.0.0.0"), port("PORT", 8080))
	c.grpcAddr = joinHostPort(env("GRPC_HOST", "0.0.0.0"), port("GRPC_PORT", 8081))
	cm.debugAddr = joinHostPort(env("DEBUG_HOST", "0.0.0.0"), port("DEBUG_PORT", 6070))
	if b, err := boolean("USE_PROMETHEUS", false); err != nil {
		add(err)
	} else if b {
		cm.promAddr = env("PROMETHEUS_ADDR", ":9090")
	}
	cm.configDir = filepath.Join(env("RUNTIME_ROOT", "/srv/runtime_data/current"), getenv("RUNTIME_SUBDIRECTORY"),
		env("RUNTIME_APPDIRECTORY", "config"))
	var err error
	cm.ignoreDot, err = boolean("RUNTIME_IGNOREDOTFILES", false)
	add(err)
	_, err = boolean("RUNTIME_WATCH_ROOT", true) // both ways, the directory is read whole on change
	add(err)
	cm.merge, err = boolean("MERGE_DOMAIN_CONFIG", false)
	add(err)
	cm.shadow, err = boolean("SHADOW_MODE", false)
	add(err)
	cm.stopIncr, err = boolean("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)
	add(err)
	cm.nearRatio = 0.8
	if v := getenv("NEAR_LIMIT_RATIO"); v != "" {
		f, err := strconv.ParseFloat(v, 32)
		if err != nil || f < 0 || f > 1 {
			add(fmt.Errorf("NEAR_LIMIT_RATIO %q: want a number from 0 to 1", v))
		}
		cm.nearRatio = f
	}
	if b, err := boolean("LIMIT_RESPONSE_HEADERS_ENABLED", false); err != nil {
		add(err)
	} else if b {
		h := sidecar.DefaultHeaderNames
		h.Limit = env("LIMIT_LIMIT_HEADER", h.Limit)
		h.Remaining = env("LIMIT_REMAINING_HEADER", h.Remaining)
		h.Reset = env("LIMIT_RESET_HEADER", h.Reset)
		cm.headers = &h
	}
	cm.prefix = getenv("CACHE_KEY_PREFIX")
	cm.timeout = 10 * time.Second
	if v := getenv("REDIS_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			add(fmt.Errorf("REDIS_TIMEOUT %q: want a positive duration such as 10s", v))
		}
		cm.timeout = d
	}
	cm.poolSize = port("REDIS_POOL_SIZE", 10)

	// Redis.
	switch st := strings.ToLower(env("REDIS_SOCKET_TYPE", "unix")); st {
	case "tcp", "unix":
		cm.network = st
	default:
		add(fmt.Errorf("REDIS_SOCKET_TYPE %q: want tcp or unix", st))
	}
	url := env("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")
	switch t := strings.ToLower(env("REDIS_TYPE", "SINGLE")); t {
	case "single":
		c.redisAddr = url
	case "cluster":
		c.redisAddr, cm.cluster = url, true
	case "sentinel":
		master, sentinels, ok := strings.Cut(url, ",")
		if !ok {
			add(fmt.Errorf("REDIS_URL %q: with REDIS_TYPE=sentinel, want the master name, then the Sentinels: mymaster,host1:26379,host2:26379", url))
		}
		c.sentinelMaster, c.redisAddr = master, sentinels
	default:
		add(fmt.Errorf("REDIS_TYPE %q: want single, sentinel or cluster", t))
	}
	if auth := getenv("REDIS_AUTH"); auth != "" {
		if user, pass, ok := strings.Cut(auth, ":"); ok {
			c.redisUser, c.redisPassword = user, pass
		} else {
			c.redisPassword = auth
		}
	}
	c.redisTLS, err = boolean("REDIS_TLS", false)
	add(err)
	if c.redisTLS {
		c.redisTLSCA = getenv("REDIS_TLS_CACERT")
		c.redisTLSCert = getenv("REDIS_TLS_CLIENT_CERT")
		c.redisTLSKey = getenv("REDIS_TLS_CLIENT_KEY")
		cm.skipVerify, err = boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)
		add(err)
	}
	if strings.EqualFold(getenv("BACKEND_TYPE"), "memcache") {
		cm.ignored = append(cm.ignored, "BACKEND_TYPE=memcache: counters are kept in Redis only (REDIS_URL)")
	}

	// Logs: upstream's levels (logrus), upstream's default WARN.
	lvl := strings.ToLower(env("LOG_LEVEL", "warn"))
	switch lvl {
	case "trace":
		lvl = "debug"
	case "fatal", "panic":
		lvl = "error"
	case "warning":
		lvl = "warn"
	}
	if err := c.logLevel.UnmarshalText([]byte(lvl)); err != nil {
		add(fmt.Errorf("LOG_LEVEL %q: want debug, info, warn or error", getenv("LOG_LEVEL")))
	}
	switch f := strings.ToLower(env("LOG_FORMAT", "text")); f {
	case "text":
	case "json":
		c.logJSON = true
	default:
		add(fmt.Errorf("LOG_FORMAT %q: want text or json", f))
	}
	for _, s := range ignoredSettings {
		if v := getenv(s.name); v != "" {
			cm.ignored = append(cm.ignored, s.name+": "+s.why)
		}
	}
	if k := getenv("HYBRIDRATED_HASH_KEY"); k != "" {
		c.hashKey = []byte(k)
	}
	// HYBRIDRATED_ALGORITHM, which upstream never reads, is the opt-in to another algorithm for
	// every limit (hybrid: local-first token buckets); empty keeps upstream's windows and answers.
	if a := policy.Algorithm(getenv("HYBRIDRATED_ALGORITHM")); a != "" {
		if _, err := policy.NewUpstreamConfig(nil, policy.WithUpstreamAlgorithm(a)); err != nil {
			add(fmt.Errorf("HYBRIDRATED_ALGORITHM: %w", err))
		}
		cm.algorithm = a
	}
	// HYBRIDRATED_WINDOW_LEASE, which upstream never reads, sizes the leases of upstream's windows
	// (policy.WithWindowLeases); 0 counts every check in Redis, as upstream does.
	cm.lease = DefaultWindowLease
	if v := getenv("HYBRIDRATED_WINDOW_LEASE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			add(fmt.Errorf("HYBRIDRATED_WINDOW_LEASE %q: want a duration of 0 or more", v))
		}
		cm.lease = d
	}
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	if _, err := c.tlsConfig(); err != nil {
		return c, err
	}
	return c, nil
}

func joinHostPort(host string, port int) string { return host + ":" + strconv.Itoa(port) }

// upstreamSource serves upstream's configuration directory: the UpstreamConfig in force for the
// sidecar, its Policy in the Enforcer, reloaded when the directory's files change (a symlink swap
// included: the directory is read whole, through its links, on every poll).
type upstreamSource struct {
	cm      *compat
	target  policy.Target
	log     *slog.Logger
	rl      *reloads
	metrics *upstreamMetrics // counts the loads under upstream's names
	cur     atomic.Pointer[policy.UpstreamConfig]
	digest  [sha256.Size]byte
}

// load reads the directory and, when it changed since the last load (or force), puts it in
// force. An invalid configuration is logged and the previous one stays.
func (u *upstreamSource) load(force bool) error {
	d, err := dirDigest(u.cm.configDir, u.cm.ignoreDot)
	if err == nil && !force && d == u.digest {
		return nil
	}
	var cfg *policy.UpstreamConfig
	if err == nil {
		var files []*policy.UpstreamFile
		files, err = policy.LoadUpstreamDir(u.cm.configDir, u.cm.ignoreDot)
		if err == nil {
			opts := []policy.UpstreamOption{policy.WithUpstreamAlgorithm(u.cm.algorithm)}
			if u.cm.merge {
				opts = append(opts, policy.WithMergeDomains())
			}
			cfg, err = policy.NewUpstreamConfig(files, opts...)
		}
	}
	if err == nil {
		err = u.target.SetPolicy(cfg.Policy())
	}
	u.digest = d
	if err != nil {
		u.metrics.loadFail.Add(1)
		u.rl.failedWith(err, time.Now())
		u.log.Error("error loading new configuration; the previous one stays in force", "dir", u.cm.configDir, "err", err)
		return err
	}
	u.cur.Store(cfg)
	u.metrics.loadOK.Add(1)
	u.rl.succeeded(len(cfg.Policy().Rules), time.Now())
	u.log.Info("successfully loaded new configuration", "dir", u.cm.configDir, "domains", cfg.Domains(), "limits", len(cfg.Policy().Rules))
	return nil
}

// run polls the directory every interval until ctx ends.
func (u *upstreamSource) run(ctx context.Context, interval time.Duration) {
	every.Tick(ctx, interval, func() { _ = u.load(false) })
}

// dirDigest hashes the names and contents of the files under dir (through symlinks).
func dirDigest(dir string, ignoreDot bool) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return sum, err
	}
	var paths []string
	err = filepath.WalkDir(real, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ignoreDot && p != real && strings.HasPrefix(de.Name(), ".") {
			if de.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !de.IsDir() {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return sum, err
	}
	sort.Strings(paths)
	h := sha256.New()
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return sum, err
		}
		rel, _ := filepath.Rel(real, p)
		fmt.Fprintf(h, "%s\x00%d\x00", rel, len(data))
		h.Write(data)
	}
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// compatPrefix is the Redis key prefix under CACHE_KEY_PREFIX.
func (cm *compat) keyPrefix() string { return cm.prefix + hybrid.DefaultKeyPrefix }
