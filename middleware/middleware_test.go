package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/middleware"
	"github.com/hybridrate/hybridrate/policy"
)

// fake is a Checker that answers a fixed result and records what it was asked.
type fake struct {
	mu   sync.Mutex
	res  policy.Result
	err  error
	dims map[string]string // the dimension values asked for, by the last request
	tier string
	ask  []string // dimensions to ask for
}

func (f *fake) Check(_ context.Context, req *policy.Request) (policy.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dims = map[string]string{}
	for _, d := range f.ask {
		if v, ok := req.Dims.Dimension(d); ok {
			f.dims[d] = v
		}
	}
	f.tier = req.Tier
	return f.res, f.err
}

// served counts the requests that reached the handler and keeps the last one's result.
type served struct {
	n   atomic.Int64
	res atomic.Pointer[policy.Result]
}

func (s *served) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.n.Add(1)
	if res, ok := middleware.FromContext(r.Context()); ok {
		s.res.Store(&res)
	}
	w.WriteHeader(http.StatusOK)
}

func do(t *testing.T, h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func mustNew(t *testing.T, c policy.Checker, opts ...middleware.Option) *middleware.Middleware {
	t.Helper()
	m, err := middleware.New(c, opts...)
	require.NoError(t, err)
	return m
}

var (
	allowedResult = policy.Result{Allowed: true, Decisions: []policy.Decision{
		{Rule: "global", Unit: "global", Allowed: true, Limit: 10000, Window: 2 * time.Second, Remaining: 9000, ResetAfter: 200 * time.Millisecond},
		{Rule: "per-key", Unit: "per-key.minute", Allowed: true, Limit: 60, Window: time.Minute, Remaining: 12, ResetAfter: 48 * time.Second},
		{Rule: "try", Unit: "try", Allowed: false, Shadow: true, Limit: 1, Window: time.Hour, RetryAfter: time.Hour},
	}}
	deniedResult = policy.Result{Allowed: false, Rule: "per-key", RetryAfter: 1200 * time.Millisecond, Decisions: []policy.Decision{
		{Rule: "global", Unit: "global", Allowed: true, Limit: 10000, Window: 2 * time.Second, Remaining: 9000, ResetAfter: 200 * time.Millisecond},
		{Rule: "per-key", Unit: "per-key.minute", Allowed: false, Limit: 60, Window: time.Minute, Remaining: 0, RetryAfter: 1200 * time.Millisecond, ResetAfter: time.Minute},
	}}
)

func TestAllowedRequestHeadersAndContext(t *testing.T) {
	t.Parallel()
	next := &served{}
	h := mustNew(t, &fake{res: allowedResult}).Handler(next)
	w := do(t, h, httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, int64(1), next.n.Load())
	hd := w.Header()
	// The counter closest to its limit: per-key.minute, 12 left; its reset rounded up.
	assert.Equal(t, "60", hd.Get("X-RateLimit-Limit"))
	assert.Equal(t, "12", hd.Get("X-RateLimit-Remaining"))
	assert.Equal(t, "48", hd.Get("X-RateLimit-Reset"))
	// Every enforced counter, none of the shadow ones.
	assert.Equal(t, `"global";q=10000;w=2, "per-key.minute";q=60;w=60`, hd.Get("RateLimit-Policy"))
	assert.Equal(t, `"global";r=9000;t=1, "per-key.minute";r=12;t=48`, hd.Get("RateLimit"))
	assert.Empty(t, hd.Get("Retry-After"))

	res := next.res.Load()
	require.NotNil(t, res, "the handler sees the result in its context")
	assert.Equal(t, allowedResult, *res)
	_, ok := middleware.FromContext(context.Background())
	assert.False(t, ok)
}

func TestDeniedRequestAnswer(t *testing.T) {
	t.Parallel()
	next := &served{}
	h := mustNew(t, &fake{res: deniedResult}).Handler(next)
	w := do(t, h, httptest.NewRequest("POST", "/", nil))
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, int64(0), next.n.Load(), "a denied request never reaches the handler")
	assert.Equal(t, "2", w.Header().Get("Retry-After"), "1.2s rounded up")
	assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
	assert.Equal(t, `{"error":"rate_limit_exceeded","rule":"per-key","retry_after_seconds":2}`+"\n", w.Body.String())
	assert.Equal(t, "60", w.Header().Get("X-RateLimit-Limit"), "the denying counter")
	assert.Equal(t, "0", w.Header().Get("X-RateLimit-Remaining"))
	assert.Equal(t, "60", w.Header().Get("X-RateLimit-Reset"))
	assert.Equal(t, `"global";r=9000;t=1, "per-key.minute";r=0;t=60`, w.Header().Get("RateLimit"))
}

func TestRetryAfterRounding(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{{0, "1"}, {time.Nanosecond, "1"}, {time.Second, "1"}, {time.Second + 1, "2"}, {59500 * time.Millisecond, "60"}, {time.Hour, "3600"}} {
		res := policy.Result{Rule: "r", RetryAfter: tc.d}
		w := do(t, mustNew(t, &fake{res: res}).Handler(&served{}), httptest.NewRequest("GET", "/", nil))
		assert.Equal(t, tc.want, w.Header().Get("Retry-After"), tc.d.String())
		assert.Equal(t, `{"error":"rate_limit_exceeded","rule":"r","retry_after_seconds":`+tc.want+"}\n", w.Body.String())
		assert.Empty(t, w.Header().Get("X-RateLimit-Limit"), "no counter consulted: no X-RateLimit headers")
	}
}

func TestHeaderSets(t *testing.T) {
	t.Parallel()
	names := []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"}
	for _, tc := range []struct {
		set  middleware.HeaderSet
		want []bool
	}{
		{middleware.AllHeaders, []bool{true, true, true, true, true}},
		{middleware.XRateLimitHeaders, []bool{true, true, true, false, false}},
		{middleware.DraftHeaders, []bool{false, false, false, true, true}},
		{middleware.NoHeaders, []bool{false, false, false, false, false}},
	} {
		for _, res := range []policy.Result{allowedResult, deniedResult} {
			w := do(t, mustNew(t, &fake{res: res}, middleware.WithHeaders(tc.set)).Handler(&served{}), httptest.NewRequest("GET", "/", nil))
			all := do(t, mustNew(t, &fake{res: res}).Handler(&served{}), httptest.NewRequest("GET", "/", nil))
			for i, name := range names {
				assert.Equal(t, tc.want[i], w.Header().Get(name) != "", "set %d, %s", tc.set, name)
				if tc.want[i] { // a set's values are formatted apart from the others': the same values
					assert.Equal(t, all.Header().Get(name), w.Header().Get(name), "set %d, %s", tc.set, name)
				}
			}
			if !res.Allowed {
				assert.Equal(t, "2", w.Header().Get("Retry-After"), "Retry-After whatever the set")
			}
		}
	}
	_, err := middleware.New(&fake{}, middleware.WithHeaders(8))
	assert.ErrorIs(t, err, middleware.ErrBadOption)
}

func TestMissingKeyAnswer(t *testing.T) {
	t.Parallel()
	res := policy.Result{Rule: "per-key", MissingKey: true}
	next := &served{}
	w := do(t, mustNew(t, &fake{res: res}).Handler(next), httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusUnauthorized, w.Code)
	assert.Equal(t, `{"error":"missing_rate_limit_key","rule":"per-key"}`+"\n", w.Body.String())
	assert.Equal(t, int64(0), next.n.Load())

	w = do(t, mustNew(t, &fake{res: res}, middleware.WithMissingKeyStatus(http.StatusForbidden)).Handler(next),
		httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusForbidden, w.Code)
	_, err := middleware.New(&fake{}, middleware.WithMissingKeyStatus(200))
	assert.ErrorIs(t, err, middleware.ErrBadOption)

	// Shadow mode admits a request that lacks a key.
	w = do(t, mustNew(t, &fake{res: policy.Result{Allowed: true, ShadowDenied: true, MissingKey: true, Rule: "per-key"}}).Handler(next),
		httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusOK, w.Code)
}

func TestErrorAnswers(t *testing.T) {
	t.Parallel()
	next := &served{}
	w := do(t, mustNew(t, &fake{err: policy.ErrClosed}).Handler(next), httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Equal(t, `{"error":"rate_limiter_unavailable"}`, w.Body.String())
	w = do(t, mustNew(t, &fake{err: policy.ErrInvalidCost}).Handler(next), httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Equal(t, `{"error":"bad_request"}`, w.Body.String())
	assert.Equal(t, int64(0), next.n.Load())

	// An error handler may fail open.
	failOpen := func(w http.ResponseWriter, r *http.Request, err error) { next.ServeHTTP(w, r) }
	w = do(t, mustNew(t, &fake{err: errors.New("boom")}, middleware.WithErrorHandler(failOpen)).Handler(next),
		httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, int64(1), next.n.Load())
}

func TestKeyExtraction(t *testing.T) {
	t.Parallel()
	all := []string{"api_key", "user", "ip", "tenant", "route", "method", "region"}
	type ctxUser struct{}
	f := &fake{res: policy.Result{Allowed: true}, ask: all}
	m := mustNew(t, f,
		middleware.WithUser(func(r *http.Request) string { s, _ := r.Context().Value(ctxUser{}).(string); return s }),
		middleware.WithTenant(func(r *http.Request) string { return r.Header.Get("X-Tenant") }),
		middleware.WithDimension("region", func(r *http.Request) string { return r.URL.Query().Get("region") }),
		middleware.WithTier(func(r *http.Request) string { return r.Header.Get("X-Plan") }),
	)
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", m.Handler(&served{}))
	r := httptest.NewRequest("GET", "/items/42?region=eu", nil)
	r.RemoteAddr = "198.51.100.7:5555"
	r.Header.Set("X-API-Key", "k-123")
	r.Header.Set("X-Tenant", "acme")
	r.Header.Set("X-Plan", "pro")
	r = r.WithContext(context.WithValue(r.Context(), ctxUser{}, "alice"))
	do(t, mux, r)
	assert.Equal(t, map[string]string{"api_key": "k-123", "user": "alice", "ip": "198.51.100.7", "tenant": "acme",
		"route": "GET /items/{id}", "method": "GET", "region": "eu"}, f.dims,
		"route is r.Pattern when the middleware wraps a handler registered on a mux")
	assert.Equal(t, "pro", f.tier)

	// Without headers or functions, those dimensions are missing.
	do(t, mustNew(t, f).Handler(&served{}), httptest.NewRequest("BREW", "/x", nil))
	assert.Equal(t, map[string]string{"ip": "192.0.2.1", "method": "OTHER"}, f.dims,
		"no route without a pattern (never the raw path); unknown methods are OTHER")
}

func TestRouteFromWrappedMux(t *testing.T) {
	t.Parallel()
	f := &fake{res: policy.Result{Allowed: true}, ask: []string{"route"}}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/exports", &served{})
	h := mustNew(t, f, middleware.WithMux(mux)).Handler(mux)
	do(t, h, httptest.NewRequest("POST", "/v1/exports", nil))
	assert.Equal(t, "POST /v1/exports", f.dims["route"], "the mux's pattern, found before the mux routes")
	do(t, h, httptest.NewRequest("GET", "/nowhere", nil))
	assert.Empty(t, f.dims["route"])

	h = mustNew(t, f, middleware.WithRoute(func(*http.Request) string { return "custom" })).Handler(mux)
	do(t, h, httptest.NewRequest("POST", "/v1/exports", nil))
	assert.Equal(t, "custom", f.dims["route"])
}

func TestAPIKeySources(t *testing.T) {
	t.Parallel()
	f := &fake{res: policy.Result{Allowed: true}, ask: []string{"api_key"}}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer tok-9")
	r.Header.Set("X-API-Key", "k-1")
	do(t, mustNew(t, f, middleware.WithAPIKeyHeader("Authorization")).Handler(&served{}), r)
	assert.Equal(t, "tok-9", f.dims["api_key"])
	do(t, mustNew(t, f, middleware.WithAPIKeyHeader("x-api-key")).Handler(&served{}), r)
	assert.Equal(t, "k-1", f.dims["api_key"])
	do(t, mustNew(t, f, middleware.WithAPIKey(func(r *http.Request) string { return r.URL.Query().Get("key") })).Handler(&served{}),
		httptest.NewRequest("GET", "/?key=q-2", nil))
	assert.Equal(t, "q-2", f.dims["api_key"])
}

func TestClientIP(t *testing.T) {
	t.Parallel()
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	cases := []struct {
		name   string
		header string // proxy header mode; "" means no trusted proxies
		peer   string
		hdrs   map[string][]string
		want   string
	}{
		{"no proxies: spoofed X-Forwarded-For ignored", "", "203.0.113.9:1000", map[string][]string{"X-Forwarded-For": {"1.2.3.4"}}, "203.0.113.9"},
		{"untrusted peer: spoofed X-Forwarded-For ignored", "X-Forwarded-For", "203.0.113.9:1000", map[string][]string{"X-Forwarded-For": {"1.2.3.4"}}, "203.0.113.9"},
		{"untrusted peer: spoofed Forwarded ignored", "Forwarded", "203.0.113.9:1000", map[string][]string{"Forwarded": {"for=1.2.3.4"}}, "203.0.113.9"},
		{"untrusted peer: spoofed X-Real-IP ignored", "X-Real-IP", "203.0.113.9:1000", map[string][]string{"X-Real-Ip": {"1.2.3.4"}}, "203.0.113.9"},
		{"trusted peer, one hop", "X-Forwarded-For", "10.0.0.1:1000", map[string][]string{"X-Forwarded-For": {"198.51.100.2"}}, "198.51.100.2"},
		{"trusted chain, walked from the right", "X-Forwarded-For", "10.0.0.1:1000", map[string][]string{"X-Forwarded-For": {"1.2.3.4, 198.51.100.2, 10.1.1.1"}}, "198.51.100.2"},
		{"client-forged left entries never chosen", "X-Forwarded-For", "10.0.0.1:1000", map[string][]string{"X-Forwarded-For": {"10.9.9.9, 6.6.6.6", "198.51.100.2"}}, "198.51.100.2"},
		{"several header lines", "X-Forwarded-For", "10.0.0.1:1000", map[string][]string{"X-Forwarded-For": {"198.51.100.2", "10.2.2.2"}}, "198.51.100.2"},
		{"all trusted: the leftmost", "X-Forwarded-For", "10.0.0.1:1000", map[string][]string{"X-Forwarded-For": {"10.3.3.3, 10.2.2.2"}}, "10.3.3.3"},
		{"garbage stops the walk at the last trusted hop", "X-Forwarded-For", "10.0.0.1:1000", map[string][]string{"X-Forwarded-For": {"198.51.100.2, unknown, 10.2.2.2"}}, "10.2.2.2"},
		{"no header: the peer", "X-Forwarded-For", "10.0.0.1:1000", nil, "10.0.0.1"},
		{"entry with a port", "X-Forwarded-For", "10.0.0.1:1000", map[string][]string{"X-Forwarded-For": {"198.51.100.2:4711"}}, "198.51.100.2"},
		{"Forwarded, quoted IPv6 with port", "Forwarded", "10.0.0.1:1000", map[string][]string{"Forwarded": {`for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711";by=10.0.0.1, for=10.5.5.5`}}, "2001:db8:cafe::17"},
		{"Forwarded, obfuscated identifier", "Forwarded", "10.0.0.1:1000", map[string][]string{"Forwarded": {`for=_hidden, for=10.5.5.5`}}, "10.5.5.5"},
		{"X-Real-IP from a trusted peer", "X-Real-IP", "10.0.0.1:1000", map[string][]string{"X-Real-Ip": {"198.51.100.2"}}, "198.51.100.2"},
		{"IPv4-mapped IPv6 peer", "", "[::ffff:203.0.113.9]:1000", nil, "203.0.113.9"},
		{"IPv6 trusted proxy", "X-Forwarded-For", "[2001:db8:ffff::1]:1000", map[string][]string{"X-Forwarded-For": {"2001:db8:1::5"}}, "2001:db8:1::5"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var opts []middleware.Option
			if tc.header != "" {
				opts = append(opts, middleware.WithTrustedProxies(tc.header, proxies...))
			}
			m := mustNew(t, &fake{}, opts...)
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.peer
			for k, vs := range tc.hdrs {
				r.Header[k] = vs
			}
			a, ok := m.ClientIP(r)
			require.True(t, ok)
			assert.Equal(t, tc.want, a.String())
		})
	}
	m := mustNew(t, &fake{})
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "not-an-address"
	_, ok := m.ClientIP(r)
	assert.False(t, ok)
	_, err := middleware.New(&fake{}, middleware.WithTrustedProxies("X-Client-IP"))
	assert.ErrorIs(t, err, middleware.ErrBadOption)
}

func TestIPv6Prefix(t *testing.T) {
	t.Parallel()
	f := &fake{res: policy.Result{Allowed: true}, ask: []string{"ip"}}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "[2001:db8:1:2:3:4:5:6]:443"
	do(t, mustNew(t, f).Handler(&served{}), r)
	assert.Equal(t, "2001:db8:1:2::/64", f.dims["ip"], "a host owns its /64")
	do(t, mustNew(t, f, middleware.WithIPv6Prefix(128)).Handler(&served{}), r)
	assert.Equal(t, "2001:db8:1:2:3:4:5:6", f.dims["ip"])
	_, err := middleware.New(f, middleware.WithIPv6Prefix(8))
	assert.ErrorIs(t, err, middleware.ErrBadOption)
}

func TestOptionErrors(t *testing.T) {
	t.Parallel()
	for name, opt := range map[string]middleware.Option{
		"nil option":                   nil,
		"nil user":                     middleware.WithUser(nil),
		"nil tenant":                   middleware.WithTenant(nil),
		"nil route":                    middleware.WithRoute(nil),
		"nil api key":                  middleware.WithAPIKey(nil),
		"bad api key header":           middleware.WithAPIKeyHeader("X Key"),
		"nil mux":                      middleware.WithMux(nil),
		"built-in dimension":           middleware.WithDimension("ip", func(*http.Request) string { return "" }),
		"nil tier":                     middleware.WithTier(nil),
		"nil error handler":            middleware.WithErrorHandler(nil),
		"shedding without utilisation": middleware.WithLoadShedding(middleware.Shedding{}),
		"negative threshold":           middleware.WithLoadShedding(middleware.Shedding{MaxInFlight: 1, Thresholds: [4]float64{-1}}),
	} {
		_, err := middleware.New(&fake{}, opt)
		assert.ErrorIs(t, err, middleware.ErrBadOption, name)
	}
	_, err := middleware.New(nil)
	assert.Error(t, err)
}

func TestNilNextHandler(t *testing.T) {
	t.Parallel()
	w := do(t, mustNew(t, &fake{res: policy.Result{Allowed: true}}).Handler(nil), httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusNotFound, w.Code)
}

func TestFailClosedAnswer(t *testing.T) {
	t.Parallel()
	res := deniedResult
	res.Unavailable, res.RetryAfter = true, 500*time.Millisecond
	next := &served{}
	w := do(t, mustNew(t, &fake{res: res}).Handler(next), httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	assert.Equal(t, `{"error":"rate_limiter_unavailable","rule":"per-key","retry_after_seconds":1}`+"\n", w.Body.String())
	w = do(t, mustNew(t, &fake{res: res}, middleware.WithFailClosedStatus(429)).Handler(next), httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Zero(t, next.n.Load())
	for _, bad := range []middleware.Option{middleware.WithFailClosedStatus(200), middleware.WithFailClosedStatus(404),
		middleware.WithFailClosedRetryAfter(-time.Second), middleware.WithExemptMethods("")} {
		_, err := middleware.New(&fake{}, bad)
		assert.ErrorIs(t, err, middleware.ErrBadOption)
	}
}

// TestExemptMethods: HEAD and OPTIONS (CORS preflight) are charged by default; WithExemptMethods
// lets whole methods through, WithSkipPreflight only real preflights.
func TestExemptMethods(t *testing.T) {
	t.Parallel()
	preflight := func() *http.Request {
		r := httptest.NewRequest("OPTIONS", "/", nil)
		r.Header.Set("Origin", "https://app.example")
		r.Header.Set("Access-Control-Request-Method", "POST")
		return r
	}
	for _, tc := range []struct {
		name string
		opts []middleware.Option
		req  *http.Request
		want int
	}{
		{"HEAD is charged by default", nil, httptest.NewRequest("HEAD", "/", nil), 429},
		{"a preflight is charged by default", nil, preflight(), 429},
		{"exempt HEAD", []middleware.Option{middleware.WithExemptMethods("head", "OPTIONS")}, httptest.NewRequest("HEAD", "/", nil), 200},
		{"exempt OPTIONS", []middleware.Option{middleware.WithExemptMethods("head", "OPTIONS")}, preflight(), 200},
		{"exempt methods only", []middleware.Option{middleware.WithExemptMethods("HEAD")}, httptest.NewRequest("GET", "/", nil), 429},
		{"skip a preflight", []middleware.Option{middleware.WithSkipPreflight()}, preflight(), 200},
		{"a plain OPTIONS is no preflight", []middleware.Option{middleware.WithSkipPreflight()}, httptest.NewRequest("OPTIONS", "/", nil), 429},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := &served{}
			w := do(t, mustNew(t, &fake{res: deniedResult}, tc.opts...).Handler(next), tc.req)
			assert.Equal(t, tc.want, w.Code)
			if tc.want == 200 {
				assert.Nil(t, next.res.Load(), "an exempt request carries no result")
			}
		})
	}
}

// classify reads the priority from a test header; without it, by method.
func classify(r *http.Request) middleware.Priority {
	switch r.Header.Get("X-Class") {
	case "critical":
		return middleware.PriorityCritical
	case "test":
		return middleware.PriorityTest
	}
	if r.Method == http.MethodGet {
		return middleware.PriorityGet
	}
	return middleware.PriorityPost
}

func request(method, class string) *http.Request {
	r := httptest.NewRequest(method, "/", nil)
	if class != "" {
		r.Header.Set("X-Class", class)
	}
	return r
}

func TestLoadSheddingByUtilisation(t *testing.T) {
	t.Parallel()
	var util atomic.Value
	util.Store(0.0)
	f := &fake{res: policy.Result{Allowed: true}}
	next := &served{}
	h := mustNew(t, f, middleware.WithLoadShedding(middleware.Shedding{
		Classify:    classify,
		Utilisation: func() float64 { return util.Load().(float64) },
		RetryAfter:  1500 * time.Millisecond,
	})).Handler(next)

	type row struct {
		util                      float64
		critical, post, get, test int // expected status
	}
	for _, r := range []row{
		{0.0, 200, 200, 200, 200},
		{0.59, 200, 200, 200, 200},
		{0.6, 200, 200, 200, 503}, // test traffic goes first
		{0.8, 200, 200, 503, 503}, // then reads
		{0.9, 200, 503, 503, 503}, // then writes
		{1.0, 503, 503, 503, 503}, // critical only at capacity
	} {
		util.Store(r.util)
		for _, c := range []struct {
			req  *http.Request
			want int
		}{
			{request("POST", "critical"), r.critical}, {request("POST", ""), r.post},
			{request("GET", ""), r.get}, {request("GET", "test"), r.test},
		} {
			w := do(t, h, c.req)
			require.Equal(t, c.want, w.Code, "utilisation %v, %s %s", r.util, c.req.Method, c.req.Header.Get("X-Class"))
			if w.Code == 503 {
				assert.Equal(t, "2", w.Header().Get("Retry-After"))
				assert.Contains(t, w.Body.String(), `{"error":"load_shed","priority":`)
			}
		}
	}
	util.Store(0.85)
	w := do(t, h, request("GET", ""))
	assert.Equal(t, `{"error":"load_shed","priority":"get","retry_after_seconds":2}`+"\n", w.Body.String())
}

func TestLoadSheddingByInFlightCount(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var entered sync.WaitGroup
	blocking := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			entered.Done()
			<-release
		}
		w.WriteHeader(http.StatusOK)
	})
	h := mustNew(t, &fake{res: policy.Result{Allowed: true}}, middleware.WithLoadShedding(middleware.Shedding{
		Classify: classify, MaxInFlight: 10,
	})).Handler(blocking)

	// Hold 7 requests in the handler: utilisation 0.7.
	var done sync.WaitGroup
	entered.Add(7)
	for i := 0; i < 7; i++ {
		done.Add(1)
		go func() {
			defer done.Done()
			r := request("POST", "")
			r.Header.Set("X-Block", "1")
			do(t, h, r)
		}()
	}
	entered.Wait()
	assert.Equal(t, 503, do(t, h, request("GET", "test")).Code, "0.7 ≥ 0.6: test shed")
	assert.Equal(t, 200, do(t, h, request("GET", "")).Code, "0.7 < 0.8: reads pass")
	close(release)
	done.Wait()
	assert.Equal(t, 200, do(t, h, request("GET", "test")).Code, "idle again")
}

func TestShedRequestsConsumeNoRateLimit(t *testing.T) {
	t.Parallel()
	f := &countingChecker{}
	h := mustNew(t, f, middleware.WithLoadShedding(middleware.Shedding{Utilisation: func() float64 { return 2 }})).Handler(&served{})
	assert.Equal(t, 503, do(t, h, request("GET", "")).Code)
	assert.Equal(t, int64(0), f.n.Load(), "shedding happens before the policy is asked")
}

type countingChecker struct{ n atomic.Int64 }

func (c *countingChecker) Check(_ context.Context, _ *policy.Request) (policy.Result, error) {
	c.n.Add(1)
	return policy.Result{Allowed: true}, nil
}

// TestLongHeaderValuesAreLimited: a 300-byte API key header counted as missing and, under
// missing_key: skip, escaped its rule (issue 23). Every length is now limited alike.
func TestLongHeaderValuesAreLimited(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{MissingKey: policy.MissingSkip, Rules: []policy.Rule{
		{ID: "per-key", Dimensions: []string{"api_key"}, Rate: 0.001, Burst: 4}}}
	s := newStack(t, nil, p, middleware.WithAPIKeyHeader("X-API-Key"))
	for _, n := range []int{250, 257, 300, 8 << 10} {
		key := strings.Repeat("k", n-1) + string(rune('a'+n%26))
		var ws []*httptest.ResponseRecorder
		for i := 0; i < 6; i++ {
			ws = append(ws, s.get(t, "203.0.113.9:4000", "X-API-Key", key))
		}
		assert.Equal(t, []int{200, 200, 200, 200, 429, 429}, codes(ws...), "%d bytes", n)
	}
}
