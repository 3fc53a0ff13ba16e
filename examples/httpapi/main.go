// Command httpapi is a small HTTP API rate-limited by hybridrate's middleware and a policy file that
// it reloads while it runs.
//
//	go run ./examples/httpapi                              # embedded Redis-compatible server
//	go run ./examples/httpapi -redis localhost:6379        # your Redis
//	curl -i -H 'X-API-Key: demo' -H 'X-Tenant: acme' localhost:8080/v1/items/1
//
// See README.md next to this file.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/middleware"
	"github.com/hybridrate/hybridrate/policy"
)

// config is the command line.
type config struct {
	addr           string        // listen address
	redisAddr      string        // Redis address; empty: embedded miniredis
	policyPath     string        // the policy file, watched for changes
	reloadInterval time.Duration // how often the policy file is read
	trustedProxies string        // comma-separated CIDR prefixes of our own proxies
	maxInFlight    int           // load-shedding capacity
	checkTimeout   time.Duration // bound of a synchronous Redis check; 0: the library's default
}

func main() {
	var cfg config
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:8080", "listen address")
	flag.StringVar(&cfg.redisAddr, "redis", "", "Redis address (host:port); empty runs an embedded, in-memory Redis-compatible server")
	flag.StringVar(&cfg.policyPath, "policy", "examples/httpapi/policy.yaml", "policy file (YAML or JSON), reloaded when it changes")
	flag.DurationVar(&cfg.reloadInterval, "reload-interval", time.Second, "how often the policy file is checked for changes")
	flag.StringVar(&cfg.trustedProxies, "trusted-proxies", "", "comma-separated CIDR prefixes of proxies whose X-Forwarded-For is trusted")
	flag.IntVar(&cfg.maxInFlight, "max-in-flight", 512, "requests in flight at which even critical requests are shed")
	flag.DurationVar(&cfg.checkTimeout, "check-timeout", 0, "bound of a synchronous Redis check before the failure policy answers (0: hybridrate's default, 5ms; 1s with the embedded server)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "httpapi:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends. ready, when set, is told the address once the server listens.
func run(ctx context.Context, cfg config, stderr io.Writer, ready func(addr string)) error {
	log := slog.New(slog.NewTextHandler(stderr, nil))
	svc, err := newService(cfg, log)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := svc.Close(closeCtx); err != nil {
			log.Warn("close", "error", err)
		}
	}()
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String(), "policy", cfg.policyPath)
	if ready != nil {
		ready(ln.Addr().String())
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// service is the example API with its rate limiting.
type service struct {
	handler  http.Handler
	enf      *policy.Enforcer
	rdb      *redis.Client
	embedded *miniredis.Miniredis // nil with a real Redis
	stop     context.CancelFunc   // stops the policy reloader
	done     chan struct{}        // closed when the reloader has stopped
}

// newService connects to Redis (or starts an embedded one), loads the policy, starts watching it and
// builds the handler.
func newService(cfg config, log *slog.Logger) (*service, error) {
	s := &service{done: make(chan struct{})}
	redisAddr := cfg.redisAddr
	hybridOpts := []hybrid.Option{hybrid.WithLogger(log)}
	strictTimeout := 50 * time.Millisecond
	if redisAddr == "" {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			return nil, fmt.Errorf("embedded redis: %w", err)
		}
		s.embedded = m
		redisAddr = m.Addr()
		log.Warn("no -redis address given: using an embedded, in-memory Redis-compatible server (miniredis); " +
			"limits are per process and lost on exit. Pass -redis host:port to share them across replicas")
		// miniredis runs Lua in Go, far slower than Redis: give its calls time.
		if cfg.checkTimeout == 0 {
			cfg.checkTimeout = time.Second
		}
		strictTimeout = time.Second
	}
	if cfg.checkTimeout > 0 {
		hybridOpts = append(hybridOpts, hybrid.WithCheckTimeout(cfg.checkTimeout))
		strictTimeout = max(strictTimeout, cfg.checkTimeout)
	}
	// MaxRetries -1: a strict script that go-redis re-sent after a timeout could count twice.
	// ContextTimeoutEnabled: the limiters' own deadlines bound every call, through this client.
	s.rdb = redis.NewClient(&redis.Options{Addr: redisAddr, MaxRetries: -1, ContextTimeoutEnabled: true})

	var hashKey []byte
	if k := os.Getenv("RATE_LIMIT_HASH_KEY"); k != "" {
		hashKey = []byte(k) // keys in Redis are HMACs: no raw API key or address reaches Redis
	}
	enf, err := policy.NewEnforcer(
		s.rdb,
		policy.WithHybridOptions(hybridOpts...),
		policy.WithStrictTimeout(strictTimeout),
		policy.WithHashKey(hashKey),
		policy.WithLogger(log),
		policy.WithOnShadowDeny(func(ev policy.ShadowEvent) {
			log.Info("shadow rule would deny", "rule", ev.Rule, "unit", ev.Unit, "retry_after", ev.Decision.RetryAfter)
		}),
	)
	if err != nil {
		s.closeRedis()
		return nil, err
	}
	s.enf = enf
	rlOpts := []policy.ReloaderOption{
		policy.WithOnReload(func(p *policy.Policy) { log.Info("policy reloaded", "path", cfg.policyPath, "rules", len(p.Rules)) }),
		policy.WithOnReloadError(func(err error) {
			log.Error("policy rejected; the previous policy stays in force", "error", err)
		}),
	}
	if cfg.reloadInterval != 0 { // zero: the default
		rlOpts = append(rlOpts, policy.WithReloadInterval(cfg.reloadInterval))
	}
	rl, err := policy.NewReloader(cfg.policyPath, enf, rlOpts...)
	if err != nil {
		_ = s.Close(context.Background())
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	go func() {
		defer close(s.done)
		_ = rl.Run(ctx)
	}()

	var proxies []netip.Prefix
	for _, p := range strings.Split(cfg.trustedProxies, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		prefix, err := netip.ParsePrefix(p)
		if err != nil {
			_ = s.Close(context.Background())
			return nil, fmt.Errorf("-trusted-proxies: %w", err)
		}
		proxies = append(proxies, prefix)
	}

	api := http.NewServeMux()
	api.HandleFunc("GET /v1/items/{id}", getItem)
	api.HandleFunc("GET /v1/search", search)
	api.HandleFunc("POST /v1/exports", createExport)
	mw, err := middleware.New(enf,
		middleware.WithAPIKeyHeader("X-API-Key"),
		middleware.WithTenant(func(r *http.Request) string { return r.Header.Get("X-Tenant") }),
		middleware.WithTier(tierOf),
		middleware.WithMux(api),
		middleware.WithTrustedProxies(middleware.HeaderXForwardedFor, proxies...),
		middleware.WithLoadShedding(middleware.Shedding{MaxInFlight: cfg.maxInFlight}),
	)
	if err != nil {
		_ = s.Close(context.Background())
		return nil, err
	}
	root := http.NewServeMux()
	root.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	root.Handle("/", mw.Handler(api))
	s.handler = root
	return s, nil
}

// Handler returns the service's HTTP handler.
func (s *service) Handler() http.Handler { return s.handler }

// Close stops the reloader, flushes the limiters and closes Redis.
func (s *service) Close(ctx context.Context) error {
	if s.stop != nil {
		s.stop()
		<-s.done
	}
	var err error
	if s.enf != nil {
		err = s.enf.Close(ctx)
	}
	s.closeRedis()
	return err
}

func (s *service) closeRedis() {
	_ = s.rdb.Close()
	if s.embedded != nil {
		s.embedded.Close()
	}
}

// tierOf is the plan of the request's API key; a real service would look it up.
func tierOf(r *http.Request) string {
	if r.Header.Get("X-API-Key") == "demo-pro" {
		return "pro"
	}
	return "free"
}

func getItem(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"id": r.PathValue("id"), "name": "item " + r.PathValue("id"), "limits": limits(r)})
}

func search(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"query": r.URL.Query().Get("q"), "results": []string{}, "limits": limits(r)})
}

func createExport(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusAccepted, map[string]any{"export": "queued", "limits": limits(r)})
}

// limits shows what the middleware put in the request's context: the remaining quota per counter.
func limits(r *http.Request) map[string]int64 {
	res, ok := middleware.FromContext(r.Context())
	if !ok {
		return nil
	}
	out := make(map[string]int64, len(res.Decisions))
	for _, d := range res.Decisions {
		if !d.Shadow {
			out[d.Unit] = d.Remaining
		}
	}
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
