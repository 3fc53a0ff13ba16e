package middleware_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
