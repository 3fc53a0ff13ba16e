package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/middleware"
	"github.com/hybridrate/hybridrate/policy"
)

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
