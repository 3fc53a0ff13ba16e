package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/middleware"
	"github.com/hybridrate/hybridrate/policy"
)

// fixed is a Checker that answers a fixed result and allocates nothing.
type fixed struct{ res policy.Result }

func (f *fixed) Check(context.Context, *policy.Request) (policy.Result, error) { return f.res, nil }

// TestHeadersAllocateNothing pins issue 24's item 4: writing every rate-limit header costs no
// allocation beyond the request's state, which the middleware allocates with or without headers.
func TestHeadersAllocateNothing(t *testing.T) {
	r := httptest.NewRequest("GET", "/items/1", nil)
	allocs := func(set middleware.HeaderSet) float64 {
		m, err := middleware.New(&fixed{res: allowedResult}, middleware.WithHeaders(set))
		if err != nil {
			t.Fatal(err)
		}
		h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		w := &sink{h: http.Header{}}
		return testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) })
	}
	none, all := allocs(middleware.NoHeaders), allocs(middleware.AllHeaders)
	if all != none {
		t.Errorf("allocations per request: %v with every header, %v with none; want the same", all, none)
	}
}

// TestHeaderValuesOutliveTheRequest checks that the header values, which point into the request's
// state, stay as they were written after later requests with other values.
func TestHeaderValuesOutliveTheRequest(t *testing.T) {
	t.Run("by default", func(t *testing.T) { testHeaderValuesOutliveTheRequest(t) })
	t.Run("without the result in the context", func(t *testing.T) {
		testHeaderValuesOutliveTheRequest(t, middleware.WithoutContextResult())
	})
}

func testHeaderValuesOutliveTheRequest(t *testing.T, opts ...middleware.Option) {
	f := &fixed{res: allowedResult}
	m, err := middleware.New(f, opts...)
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	first := httptest.NewRecorder()
	h.ServeHTTP(first, httptest.NewRequest("GET", "/", nil))
	want := first.Header().Clone()
	for i := range 100 {
		res := allowedResult
		res.Decisions = append([]policy.Decision(nil), allowedResult.Decisions...)
		res.Decisions[1].Remaining = int64(i)
		res.Decisions[1].Limit = int64(1000 + i)
		f.res = res
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	for k, v := range want {
		if got := first.Header()[k]; len(got) != 1 || got[0] != v[0] {
			t.Errorf("%s: %q after later requests, want %q", k, got, v)
		}
	}
	if got, want := first.Header().Get("X-Ratelimit-Remaining"), "12"; got != want {
		t.Errorf("X-RateLimit-Remaining = %q, want %q", got, want)
	}
}

// appending is a Checker that fills req.Decisions' storage as the policy does (and allocates only
// when it is too small), with n copies of a one-rule decision.
type appending struct{ n int }

var units = []string{"r0", "r1", "r2"}

func (a *appending) Check(_ context.Context, req *policy.Request) (policy.Result, error) {
	res := policy.Result{Allowed: true, Decisions: req.Decisions[:0]}
	for i := range a.n {
		res.Decisions = append(res.Decisions, policy.Decision{Rule: "r", Unit: units[i%len(units)], Allowed: true,
			Limit: 100, Window: time.Second, Remaining: 99})
	}
	return res, nil
}

// TestStateHoldsThePolicysDecisions checks that a request with three decisions costs no more
// allocations than a request with one: the request's state is sized by the policy's result (room
// for one decision or three).
func TestStateHoldsThePolicysDecisions(t *testing.T) {
	r := httptest.NewRequest("GET", "/items/1", nil)
	allocs := func(n int) float64 {
		m, err := middleware.New(&appending{n: n})
		if err != nil {
			t.Fatal(err)
		}
		var got int
		h := m.Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			res, _ := middleware.FromContext(r.Context())
			got = len(res.Decisions)
		}))
		w := &sink{h: http.Header{}}
		a := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) })
		if got != n {
			t.Errorf("%d decisions in the request's context, want %d", got, n)
		}
		return a
	}
	one, three := allocs(1), allocs(3)
	if three != one {
		t.Errorf("allocations per request: %v with three decisions, %v with one; want the same", three, one)
	}
}

// TestPolicyValueCache checks that requests meeting different counters in turn (two tiers, say) get
// each their own RateLimit-Policy and X-RateLimit-Limit values, which the middleware caches for
// one list of counters at a time, and that the cache costs at most one allocation per
// 64 requests that miss it.
func TestPolicyValueCache(t *testing.T) {
	tier := func(unit string, limit int64, window time.Duration) policy.Result {
		return policy.Result{Allowed: true, Decisions: []policy.Decision{
			{Rule: "global", Unit: "global", Allowed: true, Limit: 10000, Window: 2 * time.Second, Remaining: 9000},
			{Rule: unit, Unit: unit, Allowed: true, Limit: limit, Window: window, Remaining: limit / 2, ResetAfter: window / 2},
		}}
	}
	results := []policy.Result{
		tier("free", 60, time.Minute), tier("pro", 600, time.Minute), tier("pro", 600, time.Hour), tier("pro", 600, time.Hour),
	}
	want := make([]http.Header, len(results))
	for i, res := range results { // each from a middleware of its own, whose first request formats every value
		m, err := middleware.New(&fixed{res: res})
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		m.Handler(nil).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		want[i] = w.Header()
	}
	if got := want[1].Get("RateLimit-Policy"); got != `"global";q=10000;w=2, "pro";q=600;w=60` {
		t.Fatalf("RateLimit-Policy = %q", got)
	}
	f := &fixed{}
	m, err := middleware.New(f)
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(nil)
	for i := range 300 {
		k := (i * 7 / 3) % len(results)
		f.res = results[k]
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		for _, name := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit-Policy", "Ratelimit"} {
			if got, want := w.Header()[name], want[k][name]; len(got) != 1 || got[0] != want[0] {
				t.Fatalf("request %d (result %d): %s = %q, want %q", i, k, name, got, want)
			}
		}
	}
	r := httptest.NewRequest("GET", "/items/1", nil)
	w := &sink{h: http.Header{}}
	f.res = results[0]
	h.ServeHTTP(w, r)
	hit := testing.AllocsPerRun(640, func() { h.ServeHTTP(w, r) })
	i := 0
	missing := testing.AllocsPerRun(640, func() { // results 0 and 1 in turn: the cache holds one of them
		f.res = results[i%2]
		i++
		h.ServeHTTP(w, r)
	})
	if missing > hit+1.0/32 {
		t.Errorf("allocations per request: %v when the counters alternate, %v when they repeat", missing, hit)
	}
}

// TestWithoutContextResult checks the option's contract: the next handler gets the request itself,
// without the result in its context; the headers and the answers to denied requests are those of a
// middleware without the option; and a request allocates only its header values' storage (one
// allocation, none without headers), where the default allocates one.
func TestWithoutContextResult(t *testing.T) {
	for _, res := range []policy.Result{allowedResult, deniedResult} {
		var passed *http.Request
		var inCtx bool
		lean := mustNew(t, &fixed{res: res}, middleware.WithoutContextResult()).Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			passed = r
			_, inCtx = middleware.FromContext(r.Context())
		}))
		full := mustNew(t, &fixed{res: res}).Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		r := httptest.NewRequest("GET", "/", nil)
		w, want := httptest.NewRecorder(), httptest.NewRecorder()
		lean.ServeHTTP(w, r)
		full.ServeHTTP(want, httptest.NewRequest("GET", "/", nil))
		if got, want := w.Code, want.Code; got != want {
			t.Errorf("allowed %v: status %d, want %d", res.Allowed, got, want)
		}
		if got, want := w.Body.String(), want.Body.String(); got != want {
			t.Errorf("allowed %v: body %q, want %q", res.Allowed, got, want)
		}
		if len(want.Header()) < 5 || len(w.Header()) != len(want.Header()) {
			t.Errorf("allowed %v: headers %v, want %v", res.Allowed, w.Header(), want.Header())
		}
		for k, v := range want.Header() {
			if got := w.Header()[k]; len(got) != 1 || got[0] != v[0] {
				t.Errorf("allowed %v: %s = %q, want %q", res.Allowed, k, got, v)
			}
		}
		if res.Allowed && (passed != r || inCtx) {
			t.Errorf("the next handler got request %p (sent %p), a result in its context: %v; want the same request, none", passed, r, inCtx)
		}
		if !res.Allowed && passed != nil {
			t.Errorf("a denied request reached the next handler")
		}
	}
	r := httptest.NewRequest("GET", "/items/1", nil)
	allocs := func(opts ...middleware.Option) float64 {
		h := mustNew(t, &fixed{res: allowedResult}, opts...).Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		w := &sink{h: http.Header{}}
		return testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) })
	}
	if got := allocs(middleware.WithoutContextResult()); got != 1 {
		t.Errorf("allocations per request with headers: %v, want 1 (the header values' storage)", got)
	}
	if got := allocs(middleware.WithoutContextResult(), middleware.WithHeaders(middleware.NoHeaders)); got != 0 {
		t.Errorf("allocations per request without headers: %v, want 0", got)
	}
	if got := allocs(); got != 1 {
		t.Errorf("allocations per request by default: %v, want 1 (the request's state)", got)
	}
}

// TestDeniedRunAllocatesNoState checks that a run of denied requests allocates no request state
// (640 bytes with one decision): after the first denial, a denied request allocates what it does
// under WithoutContextResult, which never allocates one (its header values' storage, 144 bytes,
// its Retry-After value and its body: 320 bytes in all; more under -race, whose sync.Pool drops
// some scratches); and that an admitted request after denials still gets its result in the context.
func TestDeniedRunAllocatesNoState(t *testing.T) {
	denied := policy.Result{Allowed: false, Rule: "per-key", RetryAfter: time.Second, Decisions: []policy.Decision{
		{Rule: "per-key", Unit: "per-key", Limit: 60, Window: time.Minute, RetryAfter: time.Second, ResetAfter: time.Minute}}}
	r := httptest.NewRequest("GET", "/items/1", nil)
	perDenial := func(h http.Handler) uint64 {
		w := &sink{h: http.Header{}}
		h.ServeHTTP(w, r)
		const n = 2000
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range n {
			h.ServeHTTP(w, r)
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / n
	}
	f := &fixed{res: denied}
	var got policy.Result
	h := mustNew(t, f).Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got, _ = middleware.FromContext(r.Context())
	}))
	lean := mustNew(t, &fixed{res: denied}, middleware.WithoutContextResult()).Handler(bare)
	if per, want := perDenial(h), perDenial(lean); per > want+100 {
		t.Errorf("a denied request after a denial allocated %d bytes, want at most %d + 100 (no 640-byte state)", per, want)
	}
	f.res = allowedResult
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	if len(got.Decisions) != len(allowedResult.Decisions) || got.Decisions[1] != allowedResult.Decisions[1] {
		t.Errorf("the first admitted request after denials has %+v in its context, want %+v", got, allowedResult)
	}
}
