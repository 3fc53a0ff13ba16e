package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/middleware"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
)

// newConcLimiter returns a concurrency Limiter on a fresh redis-server.
func newConcLimiter(t *testing.T, opts ...concurrency.Option) (*concurrency.Limiter, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	lim, err := concurrency.New(rdb, append([]concurrency.Option{concurrency.WithTimeout(2 * time.Second)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lim.Close(context.Background()) })
	return lim, srv
}

// gate is a handler that holds each request until released, and reports when one has entered.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	g.entered <- struct{}{}
	<-g.release
	w.WriteHeader(http.StatusOK)
}

func tenantReq(tenant string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	if tenant != "" {
		r.Header.Set("X-Tenant", tenant)
	}
	return r
}

func TestConcurrencyCap(t *testing.T) {
	t.Parallel()
	lim, _ := newConcLimiter(t)
	const limit = 2
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	m := mustNew(t, &fake{res: policy.Result{Allowed: true}},
		middleware.WithTenant(middleware.HeaderValue("X-Tenant")),
		middleware.WithConcurrency(middleware.Concurrency{Limiter: lim, Dimension: policy.DimTenant, Limit: limit, TTL: time.Minute}))
	h := m.Handler(g)

	var wg sync.WaitGroup
	codes := make(chan int, limit+1)
	for range limit {
		wg.Go(func() { codes <- do(t, h, tenantReq("acme")).Code })
		<-g.entered
	}

	t.Run("a request over the cap gets 429 and Retry-After", func(t *testing.T) {
		w := do(t, h, tenantReq("acme"))
		assert.Equal(t, http.StatusTooManyRequests, w.Code)
		assert.Equal(t, "1", w.Header().Get("Retry-After"))
		assert.JSONEq(t, `{"error":"concurrency_limit_exceeded","dimension":"tenant","retry_after_seconds":1}`, w.Body.String())
	})

	t.Run("other keys and keyless requests have their own slots", func(t *testing.T) {
		for _, tenant := range []string{"globex", ""} {
			wg.Go(func() { codes <- do(t, h, tenantReq(tenant)).Code })
			<-g.entered
			g.release <- struct{}{}
			assert.Equal(t, http.StatusOK, <-codes, "tenant %q", tenant)
		}
	})

	for range limit {
		g.release <- struct{}{}
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		assert.Equal(t, http.StatusOK, c)
	}
	n, err := lim.InFlight(context.Background(), "tenant=acme")
	require.NoError(t, err)
	assert.Equal(t, 0, n, "finished requests released their slots")

	go func() { <-g.entered; g.release <- struct{}{} }()
	assert.Equal(t, http.StatusOK, do(t, h, tenantReq("acme")).Code)
}

func TestConcurrencyReleasedOnPanic(t *testing.T) {
	t.Parallel()
	lim, _ := newConcLimiter(t)
	m := mustNew(t, &fake{res: policy.Result{Allowed: true}},
		middleware.WithTenant(middleware.HeaderValue("X-Tenant")),
		middleware.WithConcurrency(middleware.Concurrency{Limiter: lim, Dimension: policy.DimTenant, Limit: 1, TTL: time.Minute}))
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler bug") }))
	for range 3 { // with a limit of 1, a slot kept by the first panic would turn the next ones away
		func() {
			defer func() { assert.Equal(t, "handler bug", recover()) }()
			do(t, h, tenantReq("acme"))
		}()
	}
	n, err := lim.InFlight(context.Background(), "tenant=acme")
	require.NoError(t, err)
	assert.Equal(t, 0, n)
}

func TestConcurrencyRedisDown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy outcome.FailurePolicy
		code   int
		body   string
	}{
		{outcome.FailClosed, http.StatusServiceUnavailable, `{"error":"rate_limiter_unavailable","dimension":"tenant","retry_after_seconds":1}`},
		{outcome.LocalFallback, http.StatusOK, ""},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			t.Parallel()
			lim, srv := newConcLimiter(t, concurrency.WithFailurePolicy(tc.policy), concurrency.WithTimeout(200*time.Millisecond))
			next := &served{}
			m := mustNew(t, &fake{res: policy.Result{Allowed: true}},
				middleware.WithTenant(middleware.HeaderValue("X-Tenant")),
				middleware.WithConcurrency(middleware.Concurrency{Limiter: lim, Dimension: policy.DimTenant, Limit: 5, TTL: time.Minute}))
			srv.Kill(t)
			w := do(t, m.Handler(next), tenantReq("acme"))
			assert.Equal(t, tc.code, w.Code)
			if tc.body != "" {
				assert.JSONEq(t, tc.body, w.Body.String())
				assert.Equal(t, "1", w.Header().Get("Retry-After"))
				assert.Equal(t, int64(0), next.n.Load())
			} else {
				assert.Equal(t, int64(1), next.n.Load())
			}
		})
	}
}

func TestConcurrencyLongKeyIsHashed(t *testing.T) {
	t.Parallel()
	lim, srv := newConcLimiter(t)
	next := &served{}
	m := mustNew(t, &fake{res: policy.Result{Allowed: true}},
		middleware.WithConcurrency(middleware.Concurrency{Limiter: lim, Dimension: policy.DimAPIKey, Limit: 1, TTL: time.Minute}))
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set(middleware.DefaultAPIKeyHeader, strings.Repeat("k", 4000))
	assert.Equal(t, http.StatusOK, do(t, m.Handler(next), r).Code)
	assert.Empty(t, srv.Do(t, "keys", "*"), "the lease was released")
}

func TestConcurrencyNotForDeniedOrExemptRequests(t *testing.T) {
	t.Parallel()
	lim, srv := newConcLimiter(t)
	m := mustNew(t, &fake{res: deniedResult},
		middleware.WithExemptMethods("HEAD"),
		middleware.WithConcurrency(middleware.Concurrency{Limiter: lim, Dimension: policy.DimGlobal, Limit: 1, TTL: time.Minute}))
	h := m.Handler(&served{})
	assert.Equal(t, http.StatusTooManyRequests, do(t, h, httptest.NewRequest("GET", "/", nil)).Code)
	assert.Equal(t, http.StatusOK, do(t, h, httptest.NewRequest("HEAD", "/", nil)).Code)
	assert.Equal(t, map[string]int64{}, without(srv.CommandStats(t), "info", "ping", "auth", "client", "hello", "config"),
		"no lease was asked for")
}

// without returns stats without the harness's own commands.
func without(stats map[string]int64, names ...string) map[string]int64 {
	out := map[string]int64{}
	for k, v := range stats {
		out[k] = v
	}
	for _, n := range names {
		delete(out, n)
	}
	return out
}

func TestConcurrencyOptionErrors(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := concurrency.New(rdb)
	require.NoError(t, err)
	for _, c := range []middleware.Concurrency{
		{Dimension: policy.DimTenant, Limit: 1, TTL: time.Second},
		{Limiter: lim, Limit: 1, TTL: time.Second},
		{Limiter: lim, Dimension: policy.DimTenant, Limit: 0, TTL: time.Second},
		{Limiter: lim, Dimension: policy.DimTenant, Limit: 1},
		{Limiter: lim, Dimension: "plan", Limit: 1, TTL: time.Second}, // not declared with WithDimension
	} {
		_, err := middleware.New(&fake{}, middleware.WithConcurrency(c))
		assert.ErrorIs(t, err, middleware.ErrBadOption, "%+v", c)
	}
	_, err = middleware.New(&fake{},
		middleware.WithConcurrency(middleware.Concurrency{Limiter: lim, Dimension: "plan", Limit: 1, TTL: time.Second}),
		middleware.WithDimension("plan", middleware.HeaderValue("X-Plan")))
	assert.NoError(t, err, "a custom dimension may be declared after the cap")
}
