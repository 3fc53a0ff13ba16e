package middleware_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/middleware"
	"github.com/hybridrate/hybridrate/policy"
)

// This example wraps a handler so that each API key gets two requests a minute, exactly. The Redis
// is miniredis with its clock stopped, so the output does not depend on the time it runs.
func ExampleMiddleware_Handler() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	now := time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC)
	mr.SetTime(now)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	defer rdb.Close()

	enf, err := policy.NewEnforcer(rdb, policy.WithStrictTimeout(time.Second), policy.WithClock(func() time.Time { return now }))
	if err != nil {
		log.Fatal(err)
	}
	defer enf.Close(context.Background())
	err = enf.SetPolicy(&policy.Policy{Rules: []policy.Rule{
		{ID: "per-key", Algorithm: policy.GCRA, Dimensions: []string{policy.DimAPIKey}, Limit: 2, Period: time.Minute},
	}})
	if err != nil {
		log.Fatal(err)
	}
	m, err := middleware.New(enf, middleware.WithAPIKeyHeader("X-API-Key"))
	if err != nil {
		log.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	for i := 1; i <= 3; i++ {
		r := httptest.NewRequest("GET", "/hello", nil)
		r.Header.Set("X-API-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d %s remaining=%s retry-after=%q\n", w.Code, http.StatusText(w.Code),
			w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 OK remaining=1 retry-after=""
	// 200 OK remaining=0 retry-after=""
	// 429 Too Many Requests remaining=0 retry-after="30"
}
