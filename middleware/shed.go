package middleware

import (
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// Priority is a request's class for load shedding, from the most to the least important. The zero
// Priority is PriorityCritical. It is a plain value, safe to copy and share.
type Priority uint8

// The priorities of the Stripe model: as utilisation rises, test traffic is shed first, then reads,
// then writes, and critical requests last.
const (
	// PriorityCritical is for requests that must get through while anything does (payments, say).
	PriorityCritical Priority = iota
	// PriorityPost is for writes: POST, PUT, PATCH, DELETE.
	PriorityPost
	// PriorityGet is for reads: GET, HEAD, OPTIONS.
	PriorityGet
	// PriorityTest is for test-mode traffic.
	PriorityTest
	numPriorities
)

// String returns "critical", "post", "get" or "test". It does no I/O.
func (p Priority) String() string {
	switch p {
	case PriorityCritical:
		return "critical"
	case PriorityPost:
		return "post"
	case PriorityGet:
		return "get"
	case PriorityTest:
		return "test"
	}
	return "Priority(" + strconv.Itoa(int(p)) + ")"
}

// DefaultShedThresholds are the utilisations at which each priority is shed, by default.
var DefaultShedThresholds = [4]float64{
	PriorityCritical: 1.0,
	PriorityPost:     0.9,
	PriorityGet:      0.8,
	PriorityTest:     0.6,
}

// Shedding configures load shedding by priority (Stripe's model): a request of priority p is
// answered 503 with Retry-After, before any rate limit is consulted, when the server's utilisation
// is at or above Thresholds[p]. The zero Shedding is invalid (MaxInFlight or Utilisation is
// required); [WithLoadShedding] copies it. Classify and Utilisation are called from many goroutines
// at once: they must be safe for concurrent use.
type Shedding struct {
	// Classify returns a request's priority. The default classifies GET, HEAD and OPTIONS as
	// PriorityGet and every other method as PriorityPost; critical and test traffic is only known to
	// the application.
	Classify func(r *http.Request) Priority
	// Utilisation returns the server's current load: 0 when idle, 1 at capacity (it may exceed 1).
	// When nil, the middleware counts the requests in flight through it and divides by MaxInFlight.
	Utilisation func() float64
	// MaxInFlight is the capacity for in-flight counting: required, and only used, when Utilisation
	// is nil.
	MaxInFlight int
	// Thresholds[p] is the utilisation at or above which requests of priority p are shed; entries
	// that are 0 take DefaultShedThresholds (critical 1.0, post 0.9, get 0.8, test 0.6). Use +Inf to
	// never shed a priority.
	Thresholds [4]float64
	// RetryAfter is the Retry-After of shed requests, rounded up to whole seconds; the default is 1s.
	RetryAfter time.Duration
}

type shedder struct {
	classify   func(*http.Request) Priority
	util       func() float64
	max        float64
	counting   bool
	thresholds [numPriorities]float64
	retryAfter time.Duration
	inflight   atomic.Int64
}

func newShedder(s Shedding) (*shedder, error) {
	sh := &shedder{classify: s.Classify, util: s.Utilisation, retryAfter: s.RetryAfter}
	if sh.classify == nil {
		sh.classify = classifyByMethod
	}
	if sh.util == nil {
		if s.MaxInFlight < 1 {
			return nil, badOption("load shedding needs Utilisation or a MaxInFlight of at least 1, got %d", s.MaxInFlight)
		}
		sh.counting, sh.max = true, float64(s.MaxInFlight)
	}
	for p := range sh.thresholds {
		t := s.Thresholds[p]
		switch {
		case t == 0:
			t = DefaultShedThresholds[p]
		case math.IsNaN(t) || t < 0:
			return nil, badOption("shed threshold %v for %v: want a number above 0", t, Priority(p))
		}
		sh.thresholds[p] = t
	}
	switch {
	case s.RetryAfter < 0:
		return nil, badOption("shed RetryAfter %v is negative", s.RetryAfter)
	case s.RetryAfter == 0:
		sh.retryAfter = time.Second
	}
	return sh, nil
}

// enter classifies r and decides whether to serve it. When it does and the shedder counts requests
// in flight, r now counts as one until the caller decrements inflight.
func (sh *shedder) enter(r *http.Request) (Priority, bool) {
	p := sh.classify(r)
	if p >= numPriorities {
		p = PriorityGet
	}
	if !sh.counting {
		u := sh.util()
		return p, !(u >= sh.thresholds[p])
	}
	n := sh.inflight.Add(1)
	if float64(n-1)/sh.max >= sh.thresholds[p] {
		sh.inflight.Add(-1)
		return p, false
	}
	return p, true
}

func classifyByMethod(r *http.Request) Priority {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return PriorityGet
	}
	return PriorityPost
}
