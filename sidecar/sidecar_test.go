package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/metrictest"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/policy/policytest"
	"github.com/hybridrate/hybridrate/sidecar"
)

const sidecarPolicy = `
version: 1
missing_key: skip
default_tier: free
tiers:
  free: {per_minute: 100}
  pro:  {per_minute: 1000}
rules:
  - id: per-key
    dimensions: [api_key]
    limit: 3
    period: 1m
  - id: per-ip
    dimensions: [ip]
    rate: 100
    burst: 100
  - id: uploads
    algorithm: gcra
    dimensions: [tenant]
    match: {routes: [upload]}
    limit: 10
    period: 1m
    cost: {func: hits_addend}
  - id: plan
    dimensions: [user]
    tiered: true
`

type env struct {
	srv     *sidecar.Server
	client  rlsv3.RateLimitServiceClient
	metrics *metrictest.Reader
	http    *httptest.Server
}

func newEnv(t *testing.T) *env {
	t.Helper()
	_, rdb := redistest.Mini(t)
	enf := policytest.NewEnforcer(t, rdb,
		policy.WithHybridOptions(hybrid.WithCheckTimeout(time.Second)),
		policy.WithStrictTimeout(time.Second),
		policy.WithCostFuncs(map[string]policy.CostFunc{sidecar.HitsCostName: sidecar.HitsCost}),
	)
	policytest.SetPolicy(t, enf, sidecarPolicy, "sidecar.yaml")

	metrics := metrictest.New(t)
	srv, err := sidecar.New(enf, sidecar.WithMeterProvider(metrics.Provider), sidecar.WithInstance("sc-1"))
	require.NoError(t, err)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	hs := httptest.NewServer(srv.CheckHandler())
	t.Cleanup(hs.Close)
	return &env{srv: srv, client: rlsv3.NewRateLimitServiceClient(conn), metrics: metrics, http: hs}
}

func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func headers(resp *rlsv3.RateLimitResponse) map[string]string {
	out := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		out[h.Key] = h.Value
	}
	return out
}

func TestShouldRateLimitOverGRPC(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{
		desc("api_key", "k1"), desc("remote_address", "10.0.0.1")}}
	for i := 0; i < 3; i++ {
		resp, err := e.client.ShouldRateLimit(ctx, req)
		require.NoError(t, err)
		assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode, "request %d", i)
		require.Len(t, resp.Statuses, 2)
		st := resp.Statuses[0]
		assert.Equal(t, rlsv3.RateLimitResponse_OK, st.Code)
		assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, st.CurrentLimit.Unit)
		assert.EqualValues(t, 3, st.CurrentLimit.RequestsPerUnit)
		assert.Equal(t, "per-key", st.CurrentLimit.Name)
		assert.EqualValues(t, 2-i, st.LimitRemaining)
		assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.Statuses[1].Code)
		assert.EqualValues(t, 100, resp.Statuses[1].CurrentLimit.RequestsPerUnit)
		assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_SECOND, resp.Statuses[1].CurrentLimit.Unit)
		assert.Equal(t, "3", headers(resp)["X-RateLimit-Limit"], "the most constrained descriptor")
	}
	resp, err := e.client.ShouldRateLimit(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.OverallCode)
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.Statuses[0].Code)
	assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.Statuses[1].Code, "the ip descriptor has room")
	h := headers(resp)
	assert.Equal(t, "3", h["X-RateLimit-Limit"])
	assert.Equal(t, "0", h["X-RateLimit-Remaining"])
	assert.NotEmpty(t, h["Retry-After"])
	assert.NotEqual(t, "0", h["Retry-After"])

	// Another key is not affected.
	resp, err = e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("api_key", "k2")}})
	require.NoError(t, err)
	assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode)
	assert.NotContains(t, headers(resp), "Retry-After")
}

func TestHitsAddendAndTiersAndUnknownDescriptors(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	upload := func(hits uint32) rlsv3.RateLimitResponse_Code {
		t.Helper()
		d := desc("tenant", "acme", "route", "upload")
		resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{HitsAddend: hits, Descriptors: []*rlv3.RateLimitDescriptor{d}})
		require.NoError(t, err)
		return resp.OverallCode
	}
	assert.Equal(t, rlsv3.RateLimitResponse_OK, upload(6))
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, upload(6), "6+6 > 10")
	assert.Equal(t, rlsv3.RateLimitResponse_OK, upload(4))

	// A descriptor's own hits_addend wins over the request's.
	d := desc("tenant", "globex", "route", "upload")
	d.HitsAddend = wrapperspb.UInt64(11)
	resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{HitsAddend: 1, Descriptors: []*rlv3.RateLimitDescriptor{d}})
	require.Error(t, err, "11 is above the rule's limit: no decision")
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "the caller's hits_addend is a bad request")
	assert.Nil(t, resp)

	// The tier entry picks the plan's quota.
	resp, err = e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "u1", "tier", "pro")}})
	require.NoError(t, err)
	assert.EqualValues(t, 1000, resp.Statuses[0].CurrentLimit.RequestsPerUnit)
	assert.Equal(t, "plan.minute", resp.Statuses[0].CurrentLimit.Name)
	assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, resp.Statuses[0].CurrentLimit.Unit)

	// A descriptor no rule counts is OK, without a limit.
	resp, err = e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("color", "blue")}})
	require.NoError(t, err)
	assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode)
	assert.Nil(t, resp.Statuses[0].CurrentLimit)

	// Malformed requests.
	_, err = e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	_, err = e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{{}}})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
}

func TestCheckOverHTTPJSON(t *testing.T) {
	e := newEnv(t)
	post := func(body string) (*http.Response, map[string]any) {
		t.Helper()
		resp, err := http.Post(e.http.URL, "application/json", bytes.NewBufferString(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp, out
	}
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"json-key"}]}]}`
	for i := 0; i < 3; i++ {
		resp, out := post(body)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "OK", out["overall_code"])
		assert.Equal(t, "3", resp.Header.Get("X-RateLimit-Limit"))
	}
	resp, out := post(body)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "OVER_LIMIT", out["overall_code"])
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	assert.Equal(t, "0", resp.Header.Get("X-RateLimit-Remaining"))

	resp, out = post(`{"descriptors": 7}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Equal(t, "bad_request", out["error"])
	assert.Contains(t, out["reason"], "malformed RateLimitRequest JSON")
	resp, out = post(`{"descriptors": []}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Equal(t, "no descriptors", out["reason"])
	r, err := http.Get(e.http.URL)
	require.NoError(t, err)
	r.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, r.StatusCode)

	// The sidecar layer's metrics, read through the SDK.
	for _, dp := range e.metrics.Points(t, "hybridrate.sidecar.requests") {
		inst, _ := dp.Attributes.Value("hybridrate.instance")
		assert.Equal(t, attribute.StringValue("sc-1"), inst)
	}
	got := sidecarCodes(t, e.metrics)
	assert.Equal(t, map[string]int64{"http/OK": 3, "http/OVER_LIMIT": 1, "http/bad_request": 2}, got,
		"bad requests are not limiter failures")
}

type failing struct{}

func (failing) Check(context.Context, *policy.Request) (policy.Result, error) {
	return policy.Result{}, errors.New("redis: connection refused")
}

func TestUnavailableWhenNoDecision(t *testing.T) {
	srv, err := sidecar.New(failing{})
	require.NoError(t, err)
	_, err = srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("api_key", "k")}})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	rec := httptest.NewRecorder()
	srv.CheckHandler().ServeHTTP(rec, httptest.NewRequest("POST", "/v1/check",
		bytes.NewBufferString(`{"descriptors":[{"entries":[{"key":"api_key","value":"k"}]}]}`)))
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	_, err = sidecar.New(nil)
	assert.ErrorIs(t, err, sidecar.ErrBadOption)
	_, err = sidecar.New(failing{}, sidecar.WithKeys(map[string]string{"x": ""}))
	assert.ErrorIs(t, err, sidecar.ErrBadOption)
	_, err = sidecar.New(failing{}, nil)
	assert.ErrorIs(t, err, sidecar.ErrBadOption)
}
