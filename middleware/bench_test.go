package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/cputime"
	"github.com/hybridrate/hybridrate/middleware"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
)

// sink is a ResponseWriter that keeps nothing but its header map, so that the benchmark measures
// the middleware and not a recorder.
type sink struct{ h http.Header }

func (s *sink) Header() http.Header         { return s.h }
func (s *sink) Write(b []byte) (int, error) { return len(b), nil }
func (s *sink) WriteHeader(int)             {}

var bare = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })

type floorKey struct{}

// floor is the least any middleware meeting the same contract does per admitted request: five
// formatted rate-limit header values and a value added to the request's context. It bounds from
// below what "middleware overhead" can mean on this machine.
var floor = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h["X-Ratelimit-Limit"] = []string{strconv.Itoa(1000 + len(r.URL.Path))}
	h["X-Ratelimit-Remaining"] = []string{strconv.Itoa(900 + len(r.URL.Path))}
	h["X-Ratelimit-Reset"] = []string{strconv.Itoa(100 + len(r.URL.Path))}
	h["Ratelimit-Policy"] = []string{`"per-key";q=` + strconv.Itoa(1000+len(r.URL.Path)) + ";w=1"}
	h["Ratelimit"] = []string{`"per-key";r=` + strconv.Itoa(900+len(r.URL.Path)) + ";t=1"}
	bare.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), floorKey{}, h)))
})

// BenchmarkMiddleware measures the cost the middleware adds to an admitted request on the hybrid
// path (limits far from reached, so decisions are local): compare each case with "bare". Beside
// ns/op it reports cpu-ns/op, the process's CPU time per request (all threads: the collector and
// the limiter's background work included), which a loaded machine moves far less than wall clock.
//
//	go test -run '^$' -bench BenchmarkMiddleware -benchmem -count 6 ./middleware/
func BenchmarkMiddleware(b *testing.B) {
	generous := policy.Rule{ID: "per-key", Dimensions: []string{"api_key"}, Rate: 1e9, Burst: 1e9}
	cases := []struct {
		name  string
		cfg   []policy.Option
		rules []policy.Rule
		opts  []middleware.Option
		lean  bool // WithoutContextResult (the warm-up, which reads the context, goes without it)
	}{
		{name: "hybrid-1-rule", rules: []policy.Rule{generous}},
		{name: "hybrid-1-rule-hashed", cfg: []policy.Option{policy.WithHashKey([]byte("0123456789abcdef0123456789abcdef"))}, rules: []policy.Rule{generous}},
		{name: "hybrid-3-rules", rules: []policy.Rule{
			{ID: "global", Rate: 1e9, Burst: 1e9},
			generous,
			{ID: "per-ip-route", Dimensions: []string{"ip", "route"}, Rate: 1e9, Burst: 1e9},
		}, opts: []middleware.Option{middleware.WithRoute(func(*http.Request) string { return "GET /items/{id}" })}},
		{name: "hybrid-1-rule-no-headers", rules: []policy.Rule{generous}, opts: []middleware.Option{middleware.WithHeaders(middleware.NoHeaders)}},
		{name: "hybrid-1-rule-no-context", rules: []policy.Rule{generous}, lean: true},
	}
	const keys = 1000
	reqs := make([]*http.Request, keys)
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", "/items/1", nil)
		reqs[i].Header.Set("X-API-Key", "key-"+strconv.Itoa(i))
	}
	run := func(b *testing.B, h http.Handler) {
		b.Run("serial", func(b *testing.B) {
			w := &sink{h: http.Header{}}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cputime.Process()
			for i := 0; i < b.N; i++ {
				h.ServeHTTP(w, reqs[i%keys])
			}
			cputime.Report(b, cpu)
		})
		b.Run("parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cputime.Process()
			defer cputime.Report(b, cpu)
			b.RunParallel(func(pb *testing.PB) {
				w := &sink{h: http.Header{}}
				i := 0
				for pb.Next() {
					h.ServeHTTP(w, reqs[i%keys])
					i++
				}
			})
		})
	}
	b.Run("bare", func(b *testing.B) { run(b, bare) })
	b.Run("floor", func(b *testing.B) { run(b, floor) })
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			cfg := append([]policy.Option{policy.WithHybridOptions(hybrid.WithCheckTimeout(time.Second))}, tc.cfg...)
			s := newStack(b, cfg, &policy.Policy{Rules: tc.rules}, tc.opts...)
			m, err := middleware.New(s.enf, tc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			warmUp(b, m, reqs)
			if tc.lean {
				if m, err = middleware.New(s.enf, append(tc.opts, middleware.WithoutContextResult())...); err != nil {
					b.Fatal(err)
				}
			}
			run(b, m.Handler(bare))
		})
	}
}

// warmUp sends every key through until all of them are decided locally (a key's first decision is
// made in Redis), within a deadline.
func warmUp(b *testing.B, m *middleware.Middleware, reqs []*http.Request) {
	b.Helper()
	var local bool
	probe := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, _ := middleware.FromContext(r.Context())
		local = len(res.Decisions) > 0
		for _, d := range res.Decisions {
			local = local && d.Source == outcome.SourceLocal
		}
	}))
	deadline := time.Now().Add(10 * time.Second)
	w := &sink{h: http.Header{}}
	for {
		all := true
		for _, r := range reqs {
			probe.ServeHTTP(w, r)
			all = all && local
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal("decisions did not become local within 10s")
		}
		time.Sleep(5 * time.Millisecond) // let a reconcile hand out allowances
	}
}

// BenchmarkMiddlewareDenied measures the middleware's answer to a denied request alone: a Checker
// that denies with one decision, without Redis (the policy's cost is BenchmarkMiddleware's). The
// request gets every rate-limit header, Retry-After and the JSON body.
//
//	go test -run '^$' -bench BenchmarkMiddlewareDenied -benchmem ./middleware/
func BenchmarkMiddlewareDenied(b *testing.B) {
	res := policy.Result{Allowed: false, Rule: "per-key", RetryAfter: 1200 * time.Millisecond, Decisions: []policy.Decision{
		{Rule: "per-key", Unit: "per-key", Allowed: false, Limit: 60, Window: time.Minute,
			RetryAfter: 1200 * time.Millisecond, ResetAfter: time.Minute}}}
	m, err := middleware.New(&fixed{res: res})
	if err != nil {
		b.Fatal(err)
	}
	h := m.Handler(bare)
	r := httptest.NewRequest("GET", "/items/1", nil)
	w := &sink{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cputime.Process()
	for i := 0; i < b.N; i++ {
		h.ServeHTTP(w, r)
	}
	cputime.Report(b, cpu)
}
