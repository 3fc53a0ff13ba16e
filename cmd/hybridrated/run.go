package main

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/hybridrate/hybridrate/dashboard"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/observe"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/relay"
	"github.com/hybridrate/hybridrate/sidecar"
)

//go:embed default.yaml
var defaultPolicy []byte

// addrs are the addresses the sidecar listens on, for tests that pass ":0".
type addrs struct{ grpc, http string }

// run serves until ctx ends, then shuts down gracefully: unready, drain, flush. ready, when set, is
// called once both listeners are open.
func run(ctx context.Context, cfg config, log *slog.Logger, ready func(addrs)) (err error) {
	// Redis, or an embedded stand-in.
	redisAddr := cfg.redisAddr
	hybridOpts := []hybrid.Option{hybrid.WithLogger(log), hybrid.WithIdleEviction(cfg.idleEviction)}
	if cfg.maxKeys > 0 { // 0 in a config not built by parseConfig: the library's default
		hybridOpts = append(hybridOpts, hybrid.WithMaxKeys(cfg.maxKeys))
	}
	strictTimeout := policy.DefaultStrictTimeout
	if redisAddr == "" {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			return fmt.Errorf("embedded redis: %w", err)
		}
		defer m.Close()
		redisAddr = m.Addr()
		log.Warn("no -redis given: using an embedded, in-memory Redis-compatible server (miniredis); limits are " +
			"per process and lost on exit. Pass -redis host:port to share them across replicas")
		if cfg.checkTimeout == 0 {
			cfg.checkTimeout = time.Second // miniredis runs Lua in Go, far slower than Redis
		}
		strictTimeout = time.Second
	}
	if cfg.compat != nil {
		// Upstream waits for Redis up to REDIS_TIMEOUT; a shorter bound would answer from the
		// failure policy where upstream answers from Redis.
		strictTimeout = cfg.compat.timeout
	}
	if cfg.checkTimeout > 0 {
		hybridOpts = append(hybridOpts, hybrid.WithCheckTimeout(cfg.checkTimeout))
		strictTimeout = max(strictTimeout, cfg.checkTimeout)
	}
	rdb, err := newRedisClient(redisAddr, cfg)
	if err != nil {
		return err
	}
	defer rdb.Close()

	// Metrics: OpenTelemetry, exported in Prometheus's format from a registry of our own.
	reg := promclient.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return fmt.Errorf("prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { err = errors.Join(err, mp.Shutdown(context.WithoutCancel(ctx))) }()
	instance := cfg.instance
	if instance == "" {
		instance = hybrid.DefaultInstance()
	}
	hybridOpts = append(hybridOpts, hybrid.WithMeterProvider(mp), hybrid.WithInstance(instance))
	if cfg.upstream != "" {
		// Leases from a relay, or from several with each key sharded to one of them by its name
		// (docs/operations.md, "Relays"); bans, peeks and the fleet registry still go to Redis.
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}}
		defer hc.CloseIdleConnections()
		ups := map[string]relay.Upstream{}
		for _, raw := range strings.Split(cfg.upstream, ",") {
			base := strings.TrimSuffix(strings.TrimSpace(raw), "/")
			u, err := url.Parse(base)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("-upstream %q: want http:// or https:// URLs of relays, comma-separated", cfg.upstream)
			}
			if _, dup := ups[base]; dup {
				return fmt.Errorf("-upstream %q: relay %s listed twice", cfg.upstream, base)
			}
			ups[base] = relay.Dial(base, hc)
		}
		up, err := relay.NewSharded(ups)
		if err != nil {
			return fmt.Errorf("-upstream: %w", err)
		}
		hybridOpts = append(hybridOpts, hybrid.WithUpstream(up))
	}
	var rel *relay.Relay
	if cfg.relay {
		var id [8]byte
		_, _ = rand.Read(id[:])
		var ro []relay.Option
		if cfg.relayOwner {
			ro = append(ro, relay.WithColdCredit(1))
		}
		rel, err = relay.New(relay.ClientConfig(rdb, hybrid.DefaultKeyPrefix, "relay-"+hex.EncodeToString(id[:])), ro...)
		if err != nil {
			return err
		}
		relCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
		relDone := make(chan struct{})
		go func() { defer close(relDone); rel.Run(relCtx) }()
		defer func() { stopRelay(); <-relDone; _ = rel.Close() }() // its last round reports what its children used
		log.Info("hybridrated: serving as a relay", slog.String("path", relay.Path))
	}

	prefix := ""
	if cfg.compat != nil {
		prefix = cfg.compat.keyPrefix()
		for _, why := range cfg.compat.ignored {
			log.Warn("setting of envoyproxy/ratelimit ignored", "setting", why)
		}
	}
	enfOpts := []policy.Option{
		policy.WithHybridOptions(hybridOpts...),
		policy.WithStrictTimeout(strictTimeout),
		policy.WithHashKey(cfg.hashKey),
		policy.WithDimensions("domain"),
		policy.WithCostFuncs(map[string]policy.CostFunc{sidecar.HitsCostName: sidecar.HitsCost}),
		policy.WithLogger(log),
	}
	if cfg.compat != nil {
		// Upstream's windows (the default algorithm of upstream's files) are counted as upstream
		// counts them, local-first with leases.
		enfOpts = append(enfOpts, policy.WithKeyPrefix(prefix), policy.WithWindowLeases(leaseLife(cfg.compat)))
	}
	enf, err := policy.NewEnforcer(rdb, enfOpts...)
	if err != nil {
		return err
	}
	flushed := false
	defer func() {
		if !flushed { // a start that failed half-way
			_ = enf.Close(context.WithoutCancel(ctx))
		}
	}()
	memCtx, stopMem := context.WithCancel(context.WithoutCancel(ctx))
	memDone := make(chan struct{})
	go func() {
		defer close(memDone)
		returnMemory(memCtx, cfg.idleEviction, heldKeys(enf.Limiter), debug.FreeOSMemory)
	}()
	defer func() { stopMem(); <-memDone }()
	obs, err := observe.New(enf, observe.WithMeterProvider(mp), observe.WithInstance(instance), observe.WithHashKey(cfg.dashboardKey),
		observe.WithRevealSubjects(cfg.revealSubjects), observe.WithWindow(15*time.Minute)) // the dashboard offers 1, 5 and 15 minutes
	if err != nil {
		return err
	}
	defer obs.Close()
	var dashOpts []dashboard.Option
	if cfg.fleetInterval > 0 {
		// This instance's counters, for every instance's fleet view: one small key with a TTL.
		fleet, err := observe.NewFleet(obs, rdb, observe.WithReportInterval(cfg.fleetInterval), observe.WithLogger(log))
		if err != nil {
			return err
		}
		fctx, stopFleet := context.WithCancel(context.WithoutCancel(ctx))
		fleetDone := make(chan struct{})
		go func() { defer close(fleetDone); fleet.Run(fctx) }()
		defer func() { stopFleet(); <-fleetDone }() // removes the report, before Redis is closed
		dashOpts = append(dashOpts, dashboard.WithFleet(fleet))
	}

	// The policy: a file watched for changes (and reloaded on SIGHUP), or the built-in one.
	var reloader *policy.Reloader
	rl := &reloads{source: cfg.policyPath}
	reloadReg, err := rl.register(mp, instance)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	defer func() { _ = reloadReg.Unregister() }()
	var ups *upstreamSource
	if cfg.compat != nil {
		rl.source = "envoyproxy/ratelimit configuration " + cfg.compat.configDir
		um := &upstreamMetrics{stats: new(sidecar.UpstreamStats)}
		if err := reg.Register(um); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		ups = &upstreamSource{cm: cfg.compat, target: obs, log: log, rl: rl, metrics: um}
		if err := ups.load(true); err != nil {
			return err
		}
	} else if cfg.policyPath == "" {
		rl.source = "built-in example policy"
		p, err := policy.Parse(defaultPolicy, "default.yaml")
		if err == nil {
			err = obs.SetPolicy(p)
		}
		if err != nil {
			return fmt.Errorf("built-in policy: %w", err)
		}
		rl.succeeded(len(p.Rules), time.Now())
		log.Warn("enforcing the built-in example policy (cmd/hybridrated/default.yaml): not for production; pass -policy FILE")
	} else {
		reloader, err = policy.NewReloader(
			cfg.policyPath,
			obs,
			policy.WithReloadInterval(cfg.reload),
			policy.WithOnReload(func(p *policy.Policy) {
				rl.succeeded(len(p.Rules), time.Now())
				log.Info("policy reloaded", "file", cfg.policyPath, "rules", len(p.Rules))
			}),
			policy.WithOnReloadError(func(err error) {
				rl.failedWith(err, time.Now())
				log.Error("policy rejected; the previous one stays in force", "err", err)
			}),
		)
		if err != nil {
			return err
		}
		rl.succeeded(len(enf.Policy().Rules), time.Now())
	}

	sopts := []sidecar.Option{sidecar.WithMeterProvider(mp), sidecar.WithInstance(instance)}
	if ups != nil {
		sopts = append(sopts, sidecar.WithUpstream(ups.cur.Load), sidecar.WithUpstreamHeaders(cfg.compat.headers),
			sidecar.WithUpstreamStats(ups.metrics.stats), sidecar.WithUpstreamNearLimitRatio(float32(cfg.compat.nearRatio)))
		if cfg.compat.shadow {
			sopts = append(sopts, sidecar.WithUpstreamShadow())
		}
		if cfg.compat.stopIncr {
			sopts = append(sopts, sidecar.WithUpstreamStopIncrement())
		}
	}
	srv, err := sidecar.New(obs, sopts...)
	if err != nil {
		return err
	}
	var draining atomic.Bool
	hs := health.NewServer()
	gs := grpc.NewServer(grpcServerOptions()...)
	srv.Register(gs)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)

	mux := http.NewServeMux()
	mux.Handle("POST /v1/check", srv.CheckHandler())
	if rel != nil {
		mux.Handle(relay.Path, rel.Handler())
	}
	metricsHandler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	mux.Handle("GET /metrics", metricsHandler)
	if ups != nil {
		// Upstream's endpoints on PORT.
		mux.Handle("POST /json", srv.CheckHandler())
		mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
			if draining.Load() {
				w.WriteHeader(http.StatusInternalServerError)
			}
			_, _ = io.WriteString(w, "OK")
		})
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		switch {
		case draining.Load():
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready: shutting down\n")
		case enf.Policy() == nil:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready: no policy\n")
		default:
			_, _ = io.WriteString(w, "ready\n")
		}
		_, _ = io.WriteString(w, rl.report())
	})
	mux.Handle("/dashboard/", http.StripPrefix("/dashboard", dashboard.Handler(obs, dashOpts...)))
	mux.Handle("GET /{$}", http.RedirectHandler("/dashboard/", http.StatusFound))
	hsrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	var lc net.ListenConfig
	glis, err := lc.Listen(ctx, "tcp", cfg.grpcAddr)
	if err != nil {
		return fmt.Errorf("grpc listen: %w", err)
	}
	hlis, err := lc.Listen(ctx, "tcp", cfg.httpAddr)
	if err != nil {
		glis.Close()
		return fmt.Errorf("http listen: %w", err)
	}
	errc := make(chan error, 4)
	go func() { errc <- gs.Serve(glis) }()
	go func() { errc <- hsrv.Serve(hlis) }()
	var extra []*http.Server // upstream's DEBUG_PORT and PROMETHEUS_ADDR
	if cfg.compat != nil {
		pmux := http.NewServeMux()
		pmux.Handle("GET /metrics", metricsHandler)
		pmux.Handle("GET /healthz", mux)
		// The debug port also serves Go's profiles, as upstream's does (/debug/pprof/).
		dmux := http.NewServeMux()
		dmux.Handle("/", pmux)
		dmux.HandleFunc("/debug/pprof/", pprof.Index)
		dmux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		dmux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		dmux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		dmux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		listeners := []struct {
			addr string
			h    http.Handler
		}{{cfg.compat.debugAddr, dmux}}
		if cfg.compat.promAddr != "" {
			listeners = append(listeners, struct {
				addr string
				h    http.Handler
			}{cfg.compat.promAddr, pmux})
		}
		for _, l := range listeners {
			lis, err := lc.Listen(ctx, "tcp", l.addr)
			if err != nil {
				glis.Close()
				hlis.Close()
				return fmt.Errorf("listen %s: %w", l.addr, err)
			}
			es := &http.Server{Handler: l.h, ReadHeaderTimeout: 10 * time.Second}
			extra = append(extra, es)
			go func() { _ = es.Serve(lis) }()
		}
	}
	rctx, stopReload := context.WithCancel(context.WithoutCancel(ctx)) // reloads go on during the grace period
	reloadDone := make(chan struct{})
	go func() {
		defer close(reloadDone)
		if reloader != nil {
			_ = reloader.Run(rctx)
		}
		if ups != nil {
			ups.run(rctx, cfg.reload)
		}
	}()
	hupDone := make(chan struct{})
	go func() {
		defer close(hupDone)
		for {
			select {
			case <-rctx.Done():
				return
			case _, ok := <-cfg.hup:
				if !ok {
					return
				}
				if ups != nil {
					log.Info("SIGHUP: reloading the configuration directory", "dir", cfg.compat.configDir)
					_ = ups.load(true)
					continue
				}
				if reloader == nil {
					log.Warn("SIGHUP: no -policy file to reload; the built-in policy stays")
					continue
				}
				log.Info("SIGHUP: reloading the policy file", "file", cfg.policyPath)
				if err := reloader.Reload(); err == nil {
					log.Info("SIGHUP: policy file read", "file", cfg.policyPath)
				}
			}
		}
	}()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("envoy.service.ratelimit.v3.RateLimitService", healthpb.HealthCheckResponse_SERVING)
	log.Info("hybridrated serving", "grpc", glis.Addr().String(), "http", hlis.Addr().String(),
		"redis", redisAddr, "instance", instance)
	if ready != nil {
		ready(addrs{grpc: glis.Addr().String(), http: hlis.Addr().String()})
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}

	// Graceful shutdown: unready first while still serving for the grace period, so that load
	// balancers and Envoy's health checks stop sending; then drain, then flush what is pending.
	draining.Store(true)
	hs.Shutdown()
	if serveErr == nil && cfg.shutdownGrace > 0 {
		log.Info("hybridrated shutting down: unready, serving for the grace period", "grace", cfg.shutdownGrace)
		select {
		case <-time.After(cfg.shutdownGrace):
		case serveErr = <-errc:
		}
	}
	log.Info("hybridrated shutting down: draining")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.shutdownTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-sctx.Done():
		gs.Stop()
	}
	herr := hsrv.Shutdown(sctx)
	for _, es := range extra {
		_ = es.Shutdown(sctx)
	}
	stopReload()
	<-reloadDone
	<-hupDone
	flushed = true
	cerr := enf.Close(sctx)
	if cerr == nil {
		log.Info("pending consumption flushed to Redis")
	}
	if errors.Is(serveErr, http.ErrServerClosed) || errors.Is(serveErr, grpc.ErrServerStopped) {
		serveErr = nil
	}
	return errors.Join(serveErr, herr, cerr)
}

// newRedisClient returns the client of -redis: one address is a standalone server, several are a
// Cluster's seed nodes, and with -sentinel-master they are Sentinels. MaxRetries -1 everywhere: a
// strict script that go-redis re-sent after a timeout could count twice.
func newRedisClient(addr string, cfg config) (redis.UniversalClient, error) {
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	addrs := strings.Split(addr, ",")
	if cm := cfg.compat; cm != nil {
		pool := cm.poolSize
		switch {
		case cfg.sentinelMaster != "":
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: cfg.sentinelMaster, SentinelAddrs: addrs,
				Username: cfg.redisUser, Password: cfg.redisPassword, TLSConfig: tc, MaxRetries: -1, PoolSize: pool,
				ContextTimeoutEnabled: true}), nil
		case cm.cluster:
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: cfg.redisUser,
				Password: cfg.redisPassword, TLSConfig: tc, MaxRetries: -1, PoolSize: pool, ContextTimeoutEnabled: true}), nil
		}
		return redis.NewClient(&redis.Options{Network: cm.network, Addr: addr, Username: cfg.redisUser, Password: cfg.redisPassword,
			TLSConfig: tc, MaxRetries: -1, PoolSize: pool, ContextTimeoutEnabled: true}), nil
	}
	switch {
	case cfg.sentinelMaster != "":
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: cfg.sentinelMaster, SentinelAddrs: addrs,
			Username: cfg.redisUser, Password: cfg.redisPassword, TLSConfig: tc, MaxRetries: -1,
			ContextTimeoutEnabled: true}), nil
	case len(addrs) > 1:
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: cfg.redisUser,
			Password: cfg.redisPassword, TLSConfig: tc, MaxRetries: -1, ContextTimeoutEnabled: true}), nil
	}
	return redis.NewClient(&redis.Options{Addr: addr, Username: cfg.redisUser, Password: cfg.redisPassword,
		TLSConfig: tc, MaxRetries: -1, ContextTimeoutEnabled: true}), nil
}

// reloads records the policy's reloads for the metrics and /readyz. It is safe for concurrent use.
type reloads struct {
	ok, failed atomic.Int64
	mu         sync.Mutex // guards the fields below
	source     string     // the policy file, or the built-in policy
	rules      int        // rules of the policy in force
	lastOK     time.Time  // the last successful load
	lastErr    error      // the last failed reload, until a later one succeeds
	lastErrAt  time.Time
}

func (r *reloads) succeeded(rules int, now time.Time) {
	r.ok.Add(1)
	r.mu.Lock()
	r.rules, r.lastOK, r.lastErr = rules, now, nil
	r.mu.Unlock()
}

func (r *reloads) failedWith(err error, now time.Time) {
	r.failed.Add(1)
	r.mu.Lock()
	r.lastErr, r.lastErrAt = err, now
	r.mu.Unlock()
}

// report is the policy part of /readyz's body.
func (r *reloads) report() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "policy: %s, %d rules, loaded %s\n", r.source, r.rules, r.lastOK.UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "reloads: %d ok, %d failed\n", r.ok.Load(), r.failed.Load())
	if r.lastErr != nil {
		fmt.Fprintf(&b, "last reload failed %s (the previous policy stays in force): %v\n",
			r.lastErrAt.UTC().Format(time.RFC3339), r.lastErr)
	}
	return b.String()
}

// register exports the reload counts: hybridrate.policy.reloads by result (ok, error), and
// hybridrate.policy.reload.failing, 1 while the last reload failed.
func (r *reloads) register(mp metric.MeterProvider, instance string) (metric.Registration, error) {
	m := mp.Meter("github.com/hybridrate/hybridrate/cmd/hybridrated")
	n, err1 := m.Int64ObservableCounter("hybridrate.policy.reloads",
		metric.WithDescription("Policy loads and reloads (file changes, SIGHUP), by result: ok, error (the previous policy stays)."))
	failing, err2 := m.Int64ObservableGauge("hybridrate.policy.reload.failing",
		metric.WithDescription("1 while the last policy reload failed and an older policy is in force, else 0."))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	inst := attribute.String("hybridrate.instance", instance)
	okAttr := metric.WithAttributes(inst, attribute.String("result", "ok"))
	errAttr := metric.WithAttributes(inst, attribute.String("result", "error"))
	plain := metric.WithAttributes(inst)
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(n, r.ok.Load(), okAttr)
		o.ObserveInt64(n, r.failed.Load(), errAttr)
		r.mu.Lock()
		v := int64(0)
		if r.lastErr != nil {
			v = 1
		}
		r.mu.Unlock()
		o.ObserveInt64(failing, v, plain)
		return nil
	}, n, failing)
}

// leaseLife is the lease life of upstream's windows under cm (none without it).
func leaseLife(cm *compat) time.Duration {
	if cm == nil {
		return 0
	}
	return cm.lease
}

// grpcServerOptions are the gRPC server's settings. Stream workers: each call runs on a goroutine
// whose stack has already grown to a decision's depth, instead of a new goroutine that grows (and
// copies) its stack on every call: a quarter of the server's CPU under bench/rlsbench
// (docs/benchmarks.md). gRPC spawns a goroutine as before when every worker is busy.
func grpcServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(uint32(max(16, 4*runtime.GOMAXPROCS(0))))}
}
