package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/hybridrate/hybridrate/dashboard"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/observe"
	"github.com/hybridrate/hybridrate/policy"
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
	hybridOpts := []hybrid.Option{hybrid.WithLogger(log)}
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
	if cfg.checkTimeout > 0 {
		hybridOpts = append(hybridOpts, hybrid.WithCheckTimeout(cfg.checkTimeout))
		strictTimeout = max(strictTimeout, cfg.checkTimeout)
	}
	rdb := newRedisClient(redisAddr, cfg)
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

	enf, err := policy.NewEnforcer(policy.Config{
		Redis:         rdb,
		HybridOptions: hybridOpts,
		StrictTimeout: strictTimeout,
		HashKey:       cfg.hashKey,
		Dimensions:    []string{"domain"},
		CostFuncs:     map[string]policy.CostFunc{sidecar.HitsCostName: sidecar.HitsCost},
		Logger:        log,
	})
	if err != nil {
		return err
	}
	flushed := false
	defer func() {
		if !flushed { // a start that failed half-way
			_ = enf.Close(context.WithoutCancel(ctx))
		}
	}()
	obs, err := observe.New(enf, observe.Config{MeterProvider: mp, Instance: instance, HashKey: cfg.hashKey,
		Window: 15 * time.Minute}) // the dashboard offers 1, 5 and 15 minutes
	if err != nil {
		return err
	}
	defer obs.Close()

	// The policy: a file watched for changes, or the built-in one.
	var reloader *policy.Reloader
	if cfg.policyPath == "" {
		p, err := policy.Parse(defaultPolicy, "default.yaml")
		if err == nil {
			err = obs.SetPolicy(p)
		}
		if err != nil {
			return fmt.Errorf("built-in policy: %w", err)
		}
		log.Warn("enforcing the built-in example policy (cmd/hybridrated/default.yaml): not for production; pass -policy FILE")
	} else {
		reloader, err = policy.NewReloader(policy.ReloaderConfig{
			Path: cfg.policyPath, Target: obs, Interval: cfg.reload,
			OnReload: func(p *policy.Policy) { log.Info("policy reloaded", "file", cfg.policyPath, "rules", len(p.Rules)) },
			OnError:  func(err error) { log.Error("policy rejected; the previous one stays in force", "err", err) },
		})
		if err != nil {
			return err
		}
	}

	srv, err := sidecar.New(sidecar.Config{Checker: obs, MeterProvider: mp, Instance: instance})
	if err != nil {
		return err
	}
	var draining atomic.Bool
	hs := health.NewServer()
	gs := grpc.NewServer()
	srv.Register(gs)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)

	mux := http.NewServeMux()
	mux.Handle("POST /v1/check", srv.CheckHandler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if draining.Load() || enf.Policy() == nil {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("/dashboard/", http.StripPrefix("/dashboard", dashboard.Handler(obs)))
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
	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(glis) }()
	go func() { errc <- hsrv.Serve(hlis) }()
	rctx, stopReload := context.WithCancel(ctx)
	reloadDone := make(chan struct{})
	go func() {
		defer close(reloadDone)
		if reloader != nil {
			_ = reloader.Run(rctx)
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

	// Graceful shutdown: unready first, then drain, then flush what is pending to Redis.
	log.Info("hybridrated shutting down")
	draining.Store(true)
	hs.Shutdown()
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
	stopReload()
	<-reloadDone
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
func newRedisClient(addr string, cfg config) redis.UniversalClient {
	addrs := strings.Split(addr, ",")
	switch {
	case cfg.sentinelMaster != "":
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: cfg.sentinelMaster, SentinelAddrs: addrs,
			Password: cfg.redisPassword, MaxRetries: -1, ContextTimeoutEnabled: true})
	case len(addrs) > 1:
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Password: cfg.redisPassword, MaxRetries: -1,
			ContextTimeoutEnabled: true})
	}
	return redis.NewClient(&redis.Options{Addr: addr, Password: cfg.redisPassword, MaxRetries: -1, ContextTimeoutEnabled: true})
}
