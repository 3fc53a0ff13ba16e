package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/middleware"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/sidecar"
	"github.com/hybridrate/hybridrate/strict"
)

// fixed is a policy.Checker that answers every request with the same Result, or err.
type fixed struct {
	res policy.Result
	err error
}

func (f fixed) Check(context.Context, *policy.Request) (policy.Result, error) { return f.res, f.err }

// TestSameHeadersOverHTTPAndSidecar: one policy result gives the same X-RateLimit-* and Retry-After
// headers through the HTTP middleware and through the sidecar (issue 25: the two picked the counter
// differently, and the sidecar's reset ignored a retry-after longer than the reset).
func TestSameHeadersOverHTTPAndSidecar(t *testing.T) {
	t.Parallel()
	sec := func(n int) time.Duration { return time.Duration(n) * time.Second }
	minute := policy.Decision{Rule: "per-minute", Unit: "per-minute", Allowed: true, Limit: 100, Window: time.Minute,
		Remaining: 5, ResetAfter: sec(36)} // the smaller share of its limit, but more units left than second
	second := policy.Decision{Rule: "per-second", Unit: "per-second", Allowed: true, Limit: 10, Window: time.Second,
		Remaining: 3, ResetAfter: 700 * time.Millisecond}
	deniedMinute := minute
	deniedMinute.Allowed, deniedMinute.Remaining, deniedMinute.RetryAfter, deniedMinute.ResetAfter = false, 0, sec(2), sec(1)
	deniedSecond := second
	deniedSecond.Allowed, deniedSecond.Remaining, deniedSecond.RetryAfter = false, 0, 300*time.Millisecond
	shadow := second
	shadow.Rule, shadow.Unit, shadow.Shadow, shadow.Remaining = "shadow", "shadow", true, 0

	for _, tc := range []struct {
		name string
		res  policy.Result
		want map[string]string
	}{
		{"admitted: the counter with the fewest units left", policy.Result{Allowed: true,
			Decisions: []policy.Decision{minute, second, shadow}},
			map[string]string{"X-Ratelimit-Limit": "10", "X-Ratelimit-Remaining": "3", "X-Ratelimit-Reset": "1"}},
		{"denied: the denial with the longest retry-after, reset no sooner than it", policy.Result{Rule: "per-minute",
			RetryAfter: sec(2), Decisions: []policy.Decision{deniedSecond, deniedMinute}},
			map[string]string{"X-Ratelimit-Limit": "100", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "2",
				"Retry-After": "2"}},
		{"denied by the narrower counter", policy.Result{Rule: "per-second", RetryAfter: 300 * time.Millisecond,
			Decisions: []policy.Decision{minute, deniedSecond}},
			map[string]string{"X-Ratelimit-Limit": "10", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "1",
				"Retry-After": "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fixed{res: tc.res}
			mw, err := middleware.New(c, middleware.WithHeaders(middleware.XRateLimitHeaders))
			require.NoError(t, err)
			rec := httptest.NewRecorder()
			mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec,
				httptest.NewRequest(http.MethodGet, "/", nil))
			overHTTP := map[string]string{}
			for k := range tc.want {
				if v := rec.Header().Get(k); v != "" {
					overHTTP[k] = v
				}
			}

			srv, err := sidecar.New(c)
			require.NoError(t, err)
			resp, err := srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
				Descriptors: []*rlv3.RateLimitDescriptor{desc("api_key", "k")}})
			require.NoError(t, err)
			overSidecar := map[string]string{}
			for _, h := range resp.ResponseHeadersToAdd {
				overSidecar[http.CanonicalHeaderKey(h.Key)] = h.Value
			}

			assert.Equal(t, tc.want, overHTTP, "middleware")
			assert.Equal(t, tc.want, overSidecar, "sidecar")
		})
	}
}

// TestOneErrorMapping: the middleware, the sidecar over HTTP and the sidecar over gRPC answer the
// same Checker error with the same status (policy.ErrorStatus; over gRPC its code), issue 25: an
// invalid cost was 500 in the middleware, 503 over the sidecar's HTTP and Internal over gRPC.
func TestOneErrorMapping(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		http int
		grpc codes.Code
	}{
		{"unknown domain", fmt.Errorf("%w: \"x\"", policy.ErrUnknownDomain), http.StatusBadRequest, codes.InvalidArgument},
		{"invalid cost", fmt.Errorf("%w: rule \"r\": cost 11 above its limit 10", policy.ErrInvalidCost), http.StatusBadRequest, codes.InvalidArgument},
		{"caller gave up", context.Canceled, policy.StatusClientClosedRequest, codes.Canceled},
		{"deadline", fmt.Errorf("policy: rule \"r\": %w", context.DeadlineExceeded), http.StatusServiceUnavailable, codes.Unavailable},
		{"hybrid: Redis unavailable", fmt.Errorf("policy: rule \"r\": %w", hybrid.ErrUnavailable), http.StatusServiceUnavailable, codes.Unavailable},
		{"strict: Redis unavailable", fmt.Errorf("policy: strict rules: %w", strict.ErrUnavailable), http.StatusServiceUnavailable, codes.Unavailable},
		{"closed", policy.ErrClosed, http.StatusServiceUnavailable, codes.Unavailable},
		{"no policy", policy.ErrNoPolicy, http.StatusServiceUnavailable, codes.Unavailable},
		{"anything else", errors.New("boom"), http.StatusServiceUnavailable, codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fixed{err: tc.err}
			assert.Equal(t, tc.http, policy.ErrorStatus(tc.err), "policy.ErrorStatus")

			mw, err := middleware.New(c)
			require.NoError(t, err)
			rec := httptest.NewRecorder()
			mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec,
				httptest.NewRequest(http.MethodGet, "/", nil))
			assert.Equal(t, tc.http, rec.Code, "middleware")

			srv, err := sidecar.New(c)
			require.NoError(t, err)
			rec = httptest.NewRecorder()
			srv.CheckHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/",
				strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k"}]}]}`)))
			assert.Equal(t, tc.http, rec.Code, "sidecar over HTTP")

			_, err = srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
				Descriptors: []*rlv3.RateLimitDescriptor{desc("api_key", "k")}})
			assert.Equal(t, tc.grpc, status.Code(err), "sidecar over gRPC")
		})
	}
}

// TestBrokenBodyIsBadRequest: a body that breaks off is the client's fault (400), not a body over
// MaxBody (413, which only that gets).
func TestBrokenBodyIsBadRequest(t *testing.T) {
	t.Parallel()
	srv, err := sidecar.New(fixed{res: policy.Result{Allowed: true}})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	srv.CheckHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", iotest.ErrReader(io.ErrUnexpectedEOF)))
	assert.Equal(t, http.StatusBadRequest, rec.Code)
	rec = httptest.NewRecorder()
	srv.CheckHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat(" ", sidecar.MaxBody+1))))
	assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
}
