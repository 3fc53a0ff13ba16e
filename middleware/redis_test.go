package middleware_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/middleware"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
)

// stack is a middleware over a real Enforcer on a real Redis.
type stack struct {
	srv  *redistest.Server
	enf  *policy.Enforcer
	next *served
	h    http.Handler
}

// newStack serves p through the middleware (opts) and an Enforcer on a fresh redis-server, made
// with enfOpts after the tests' defaults: drift 0 (every hybrid decision is made in Redis, so the
// tests can count exactly) and a strict timeout of 1s.
func newStack(tb testing.TB, enfOpts []policy.Option, p *policy.Policy, opts ...middleware.Option) *stack {
	tb.Helper()
	srv := redistest.Start(tb)
	rdb := srv.Client(tb, func(o *redis.Options) { o.MaxRetries = -1 })
	enfOpts = append([]policy.Option{
		policy.WithHybridOptions(hybrid.WithDriftThreshold(0), hybrid.WithCheckTimeout(time.Second)),
		policy.WithStrictTimeout(time.Second),
	}, enfOpts...)
	enf, err := policy.NewEnforcer(rdb, enfOpts...)
	require.NoError(tb, err)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = enf.Close(ctx)
	})
	require.NoError(tb, enf.SetPolicy(p))
	m, err := middleware.New(enf, opts...)
	require.NoError(tb, err)
	next := &served{}
	return &stack{srv: srv, enf: enf, next: next, h: m.Handler(next)}
}

func (s *stack) get(t *testing.T, peer string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = peer
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return do(t, s.h, r)
}

func codes(ws ...*httptest.ResponseRecorder) []int {
	var out []int
	for _, w := range ws {
		out = append(out, w.Code)
	}
	return out
}

func TestSpoofedXForwardedForFromAnUntrustedPeerSharesThePeersBucket(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{{ID: "per-ip", Dimensions: []string{"ip"}, Rate: 0.001, Burst: 2}}}
	s := newStack(t, nil, p,
		middleware.WithTrustedProxies(middleware.HeaderXForwardedFor, netip.MustParsePrefix("10.0.0.0/8")))
	// An attacker rotating X-Forwarded-For from one untrusted address gets one bucket.
	var ws []*httptest.ResponseRecorder
	for i := 0; i < 3; i++ {
		ws = append(ws, s.get(t, "203.0.113.9:4000", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i)))
	}
	assert.Equal(t, []int{200, 200, 429}, codes(ws...))
	assert.Equal(t, `{"error":"rate_limit_exceeded","rule":"per-ip","retry_after_seconds":1000}`+"\n", ws[2].Body.String(),
		"the body names the rule, never the key")

	// Behind the trusted proxy, each client has its own bucket.
	ws = ws[:0]
	for _, client := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.1", "198.51.100.2", "198.51.100.1"} {
		ws = append(ws, s.get(t, "10.0.0.5:4000", "X-Forwarded-For", "6.6.6.6, "+client))
	}
	assert.Equal(t, []int{200, 200, 200, 200, 429}, codes(ws...))
}

func TestHeadersAndRetryAfterWithRedis(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{
		// 3 per 3 s: one more every second.
		{ID: "per-key", Algorithm: policy.GCRA, Dimensions: []string{"api_key"}, Limit: 3, Period: 3 * time.Second},
		{ID: "global", Rate: 1000, Burst: 5000},
	}}
	s := newStack(t, nil, p)
	var rem []string
	for i := 0; i < 3; i++ {
		w := s.get(t, "192.0.2.1:1", "X-API-Key", "k")
		require.Equal(t, 200, w.Code)
		assert.Equal(t, "3", w.Header().Get("X-RateLimit-Limit"))
		rem = append(rem, w.Header().Get("X-RateLimit-Remaining"))
		assert.Equal(t, strconv.Itoa(i+1), w.Header().Get("X-RateLimit-Reset"), "GCRA refills one per second")
		assert.Equal(t, `"global";q=5000;w=5, "per-key";q=3;w=3`, w.Header().Get("RateLimit-Policy"),
			"hybrid rules are consulted first")
	}
	assert.Equal(t, []string{"2", "1", "0"}, rem)
	w := s.get(t, "192.0.2.1:1", "X-API-Key", "k")
	require.Equal(t, 429, w.Code)
	assert.Equal(t, "1", w.Header().Get("Retry-After"), "one token per second")
	var body struct {
		Error             string `json:"error"`
		Rule              string `json:"rule"`
		RetryAfterSeconds int    `json:"retry_after_seconds"`
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
	assert.Equal(t, "rate_limit_exceeded", body.Error)
	assert.Equal(t, "per-key", body.Rule)
	assert.Equal(t, 1, body.RetryAfterSeconds)
	assert.Equal(t, "0", w.Header().Get("X-RateLimit-Remaining"))
	assert.Regexp(t, `^"global";r=\d+;t=\d+, "per-key";r=0;t=3$`, w.Header().Get("RateLimit"))
	assert.Equal(t, int64(3), s.next.n.Load())
	res := s.next.res.Load()
	require.NotNil(t, res)
	assert.Len(t, res.Decisions, 2)
}

func TestHierarchyOverHTTPConsumesNothingOnDenial(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "global", Algorithm: policy.FixedWindow, Limit: 1000, Period: time.Hour},
		{ID: "tenant", Algorithm: policy.TokenBucket, Dimensions: []string{"tenant"}, Limit: 100, Period: time.Hour},
		{ID: "endpoint", Algorithm: policy.GCRA, Dimensions: []string{"tenant", "route"}, Limit: 1, Period: time.Hour,
			Match: policy.Match{Routes: []string{"POST /export"}}},
	}}
	mux := http.NewServeMux()
	s := newStack(t, nil, p, middleware.WithTenant(func(r *http.Request) string { return r.Header.Get("X-Tenant") }),
		middleware.WithMux(mux))
	mux.Handle("POST /export", http.NotFoundHandler())
	post := func() int {
		r := httptest.NewRequest("POST", "/export", nil)
		r.Header.Set("X-Tenant", "acme")
		return do(t, s.h, r).Code
	}
	require.Equal(t, 200, post())
	keys := func() map[string]string {
		out := map[string]string{}
		ks, _ := s.srv.Do(t, "KEYS", "hr:*").([]any)
		for _, k := range ks {
			key := k.(string)
			if s.srv.Do(t, "TYPE", key) == "hash" {
				out[key] = fmt.Sprint(s.srv.Do(t, "HGETALL", key))
			} else {
				out[key] = fmt.Sprint(s.srv.Do(t, "GET", key))
			}
		}
		return out
	}
	before := keys()
	require.Len(t, before, 3)
	assert.Equal(t, 429, post())
	assert.Equal(t, before, keys(), "the endpoint's denial left global and tenant untouched")
}

func TestTiersOverHTTP(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{DefaultTier: "free",
		Tiers: map[string]policy.Tier{"free": {PerMinute: 2}, "pro": {PerMinute: 4}},
		Rules: []policy.Rule{{ID: "plan", Dimensions: []string{"api_key"}, Tiered: true}}}
	s := newStack(t, nil, p, middleware.WithTier(func(r *http.Request) string { return r.Header.Get("X-Plan") }))
	count := func(key, plan string) int {
		n := 0
		for i := 0; i < 6; i++ {
			if s.get(t, "192.0.2.1:1", "X-API-Key", key, "X-Plan", plan).Code == 200 {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 2, count("a", "free"))
	assert.Equal(t, 4, count("b", "pro"))
	assert.Equal(t, 2, count("c", ""), "no plan: the default tier")
	w := s.get(t, "192.0.2.1:1", "X-API-Key", "b", "X-Plan", "pro")
	assert.Equal(t, `"plan.minute";q=4;w=60`, w.Header().Get("RateLimit-Policy"))
}

func TestShadowModeOverHTTP(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var events []policy.ShadowEvent
	cfg := []policy.Option{policy.WithOnShadowDeny(func(ev policy.ShadowEvent) { mu.Lock(); events = append(events, ev); mu.Unlock() })}
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "enforced", Dimensions: []string{"api_key"}, Rate: 1000, Burst: 1000},
		{ID: "candidate", Algorithm: policy.SlidingWindow, Dimensions: []string{"api_key"}, Limit: 1, Period: time.Hour, Shadow: true},
	}}
	s := newStack(t, cfg, p)
	for i := 0; i < 3; i++ {
		w := s.get(t, "192.0.2.1:1", "X-API-Key", "k")
		assert.Equal(t, 200, w.Code)
		assert.Equal(t, `"enforced";q=1000;w=1`, w.Header().Get("RateLimit-Policy"), "shadow rules stay out of the headers")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, events, 2)
	assert.Equal(t, "candidate", events[0].Rule)
	assert.Equal(t, int64(2), s.enf.Stats().ShadowDenied)
}

func TestMissingKeyOverHTTP(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "keyed", Dimensions: []string{"api_key"}, Rate: 1000, Burst: 1000, Match: policy.Match{Methods: []string{"POST"}}},
		{ID: "anon", Dimensions: []string{"api_key"}, Rate: 0.001, Burst: 2, MissingKey: policy.MissingShared, Match: policy.Match{Methods: []string{"GET"}}},
	}}
	s := newStack(t, nil, p)
	r := httptest.NewRequest("POST", "/", nil)
	w := do(t, s.h, r)
	assert.Equal(t, 401, w.Code)
	assert.Equal(t, `{"error":"missing_rate_limit_key","rule":"keyed"}`+"\n", w.Body.String())
	// Anonymous GETs from anywhere share one bucket of 2.
	assert.Equal(t, []int{200, 200, 429}, codes(s.get(t, "192.0.2.1:1"), s.get(t, "192.0.2.2:1"), s.get(t, "192.0.2.3:1")))
	assert.Equal(t, 200, s.get(t, "192.0.2.1:1", "X-API-Key", "k").Code, "a keyed GET has its own bucket")
}

func TestFailurePolicyPerRuleOverHTTPWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "open", Dimensions: []string{"api_key"}, Rate: 1000, Burst: 1000, OnFailure: outcome.FailOpen, Match: policy.Match{Methods: []string{"GET"}}},
		{ID: "closed", Algorithm: policy.GCRA, Dimensions: []string{"api_key"}, Limit: 1000, Period: time.Hour, OnFailure: outcome.FailClosed,
			Match: policy.Match{Methods: []string{"POST"}}},
	}}
	s := newStack(t, nil, p)
	post := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("X-API-Key", "k")
		return do(t, s.h, r)
	}
	require.Equal(t, 200, s.get(t, "192.0.2.1:1", "X-API-Key", "k").Code)
	require.Equal(t, 200, post().Code)
	s.srv.Kill(t)
	assert.Equal(t, 200, s.get(t, "192.0.2.1:1", "X-API-Key", "fresh").Code, "fail_open keeps serving")
	w := post()
	assert.Equal(t, 503, w.Code, "fail_closed refuses, as unavailable")
	assert.Equal(t, `{"error":"rate_limiter_unavailable","rule":"closed","retry_after_seconds":1}`+"\n", w.Body.String())
}

// TestFailClosedIsServiceUnavailable is issue 11 item 7: with Redis stopped, a fail_closed rule's
// denial is 503 with Retry-After, not the 429 of "over your limit", for hybrid and strict rules alike;
// a local_fallback rule whose local share is spent still answers 429; WithFailClosedStatus and
// WithFailClosedRetryAfter change the answer.
func TestFailClosedIsServiceUnavailable(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "hybrid-closed", Dimensions: []string{"api_key"}, Rate: 1000, Burst: 1000, OnFailure: outcome.FailClosed,
			Match: policy.Match{Methods: []string{"GET"}}},
		{ID: "strict-closed", Algorithm: policy.GCRA, Dimensions: []string{"api_key"}, Limit: 1000, Period: time.Hour,
			OnFailure: outcome.FailClosed, Match: policy.Match{Methods: []string{"POST"}}},
		{ID: "fallback", Dimensions: []string{"api_key"}, Rate: 0.001, Burst: 1, OnFailure: outcome.LocalFallback,
			Match: policy.Match{Methods: []string{"PUT"}}},
	}}
	s := newStack(t, nil, p)
	custom := newStack(t, nil, p, middleware.WithFailClosedStatus(500), middleware.WithFailClosedRetryAfter(30*time.Second))
	req := func(h http.Handler, method string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "/", nil)
		r.Header.Set("X-API-Key", "k")
		return do(t, h, r)
	}
	for _, m := range []string{"GET", "POST"} {
		require.Equal(t, 200, req(s.h, m).Code, m)
	}
	s.srv.Kill(t)
	custom.srv.Kill(t)
	for _, tc := range []struct{ method, rule string }{{"GET", "hybrid-closed"}, {"POST", "strict-closed"}} {
		for i := range 3 { // the first meets the dead Redis, the next ones the open breaker
			w := req(s.h, tc.method)
			assert.Equal(t, http.StatusServiceUnavailable, w.Code, "%s #%d", tc.method, i)
			assert.Equal(t, "1", w.Header().Get("Retry-After"), "the breaker's cooldown, rounded up")
			assert.Equal(t, `{"error":"rate_limiter_unavailable","rule":"`+tc.rule+`","retry_after_seconds":1}`+"\n", w.Body.String())
		}
		w := req(custom.h, tc.method)
		assert.Equal(t, 500, w.Code, tc.method)
		assert.Equal(t, "30", w.Header().Get("Retry-After"))
	}
	assert.Equal(t, 200, req(s.h, "PUT").Code, "local_fallback: this node's share")
	w := req(s.h, "PUT")
	assert.Equal(t, http.StatusTooManyRequests, w.Code, "local_fallback still limits: over the limit")
	assert.Contains(t, w.Body.String(), "rate_limit_exceeded")
}

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
