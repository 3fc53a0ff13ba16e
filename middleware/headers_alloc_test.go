package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

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
	f := &fixed{res: allowedResult}
	m, err := middleware.New(f)
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
