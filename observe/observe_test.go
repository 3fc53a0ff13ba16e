package observe_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/metrictest"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/middleware"
	"github.com/hybridrate/hybridrate/observe"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/policy/policytest"
)

const testPolicy = `
version: 1
default_tier: free
tiers:
  free: {per_minute: 1000}
  pro:  {per_minute: 5000}
rules:
  - id: per-key
    dimensions: [api_key]
    rate: 0.001
    burst: 5
  - id: exports
    algorithm: gcra
    dimensions: [api_key]
    match: {routes: ["POST /v1/exports"]}
    limit: 10
    period: 1h
  - id: trial
    dimensions: [api_key]
    match: {routes: ["GET /v1/search"]}
    rate: 0.001
    burst: 2
    shadow: true
`

type fixture struct {
	obs     *observe.Observer
	enf     *policy.Enforcer
	metrics *metrictest.Reader
}

// newFixture makes an Observer with opts of an Enforcer on miniredis; its instance is "node-1"
// unless opts name another, and its meter provider the fixture's reader's.
func newFixture(t *testing.T, opts []observe.Option) *fixture {
	t.Helper()
	obs, enf, metrics := policytest.Observed(t, "node-1", testPolicy, "test.yaml", opts...)
	return &fixture{obs: obs, enf: enf, metrics: metrics}
}

func (f *fixture) check(t *testing.T, key, route, tier string) policy.Result {
	t.Helper()
	dims := policy.Values{"api_key": key}
	if route != "" {
		dims["route"] = route
	}
	res, err := f.obs.Check(context.Background(), &policy.Request{Method: "GET", Tier: tier, Dims: dims})
	require.NoError(t, err)
	return res
}

func TestMetricsByOutcomeRuleRouteAndTier(t *testing.T) {
	f := newFixture(t, nil)
	for i := 0; i < 8; i++ { // burst 5: 5 admitted, 3 denied
		f.check(t, "secret-key-1", "GET /v1/items/{id}", "pro")
	}
	inst := attribute.String("hybridrate.instance", "node-1")
	items := attribute.String("route", "GET /v1/items/{id}")
	pro := attribute.String("tier", "pro")
	assert.EqualValues(t, 5, f.metrics.Sum(t, "hybridrate.requests", inst, items, pro, attribute.String("outcome", "allowed")))
	assert.EqualValues(t, 3, f.metrics.Sum(t, "hybridrate.requests", inst, items, pro, attribute.String("outcome", "denied")))
	perKey := attribute.String("rule", "per-key")
	assert.EqualValues(t, 5, f.metrics.Sum(t, "hybridrate.rule.decisions", perKey, items, attribute.String("outcome", "allowed")))
	assert.EqualValues(t, 3, f.metrics.Sum(t, "hybridrate.rule.decisions", perKey, items, attribute.String("outcome", "denied")))
	assert.EqualValues(t, 8, f.metrics.Sum(t, "hybridrate.rule.decisions", perKey,
		attribute.String("source", "central"))+f.metrics.Sum(t, "hybridrate.rule.decisions", perKey,
		attribute.String("source", "local"))+f.metrics.Sum(t, "hybridrate.rule.decisions", perKey,
		attribute.String("source", "deny-cache"))+f.metrics.Sum(t, "hybridrate.rule.decisions", perKey,
		attribute.String("source", "memo")), "every decision has a source")
	assert.Positive(t, f.metrics.Sum(t, "hybridrate.rule.near_limit", perKey), "the last admitted ones were near the limit")
	assert.EqualValues(t, 8, f.metrics.HistogramCount(t, "hybridrate.check.duration", inst))

	// An unknown tier is the policy's default tier; no raw key in any attribute.
	f.check(t, "secret-key-2", "GET /v1/items/{id}", "bogus-tier")
	assert.EqualValues(t, 1, f.metrics.Sum(t, "hybridrate.requests", attribute.String("tier", "free")))
	assert.Zero(t, f.metrics.Sum(t, "hybridrate.requests", attribute.String("tier", "bogus-tier")))
	for _, m := range f.metrics.Metrics(t, "") {
		assert.NotContains(t, strings.ToLower(metricdataString(m)), "secret-key", m.Name)
	}
}

func metricdataString(m metricdata.Metrics) string {
	var b strings.Builder
	add := func(s attribute.Set) {
		for _, kv := range s.ToSlice() {
			b.WriteString(string(kv.Key) + "=" + kv.Value.String() + " ")
		}
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	}
	return b.String()
}

func TestShadowWouldDenyAndRedisPathLatency(t *testing.T) {
	f := newFixture(t, nil)
	for i := 0; i < 4; i++ { // the trial rule (burst 2, shadow) would deny twice; nothing is denied
		res := f.check(t, "k", "GET /v1/search", "")
		assert.True(t, res.Allowed)
	}
	trial := attribute.String("rule", "trial")
	assert.EqualValues(t, 2, f.metrics.Sum(t, "hybridrate.rule.shadow_denials", trial, attribute.String("route", "GET /v1/search")))
	assert.EqualValues(t, 2, f.metrics.Sum(t, "hybridrate.rule.decisions", trial, attribute.Bool("shadow", true), attribute.String("outcome", "denied")))
	assert.EqualValues(t, 2, f.metrics.Sum(t, "hybridrate.requests", attribute.String("outcome", "shadow_denied")))
	snap := f.obs.Snapshot(time.Minute)
	require.Len(t, snap.Denied, 1)
	assert.Equal(t, observe.DenyCount{Route: "GET /v1/search", Rule: "trial", Tier: "free", Shadow: true, N: 2, Rate: 2.0 / 60}, snap.Denied[0])
	assert.EqualValues(t, 2, snap.Sum.ShadowDenied)
	assert.Zero(t, snap.Sum.Denied)

	before := f.metrics.HistogramCount(t, "hybridrate.check.duration", attribute.String("path", "central"))
	f.check(t, "k", "POST /v1/exports", "") // a strict rule: a Redis round trip
	assert.Equal(t, before+1, f.metrics.HistogramCount(t, "hybridrate.check.duration", attribute.String("path", "central")))
	assert.EqualValues(t, 1, f.metrics.Sum(t, "hybridrate.rule.decisions", attribute.String("rule", "exports"), attribute.String("source", "strict")))
}

func TestRouteAndTierLabelsAreBounded(t *testing.T) {
	f := newFixture(t, []observe.Option{observe.WithMaxLabels(2)})
	for _, r := range []string{"GET /a", "GET /b", "GET /c", "GET /d", "GET /a"} {
		f.check(t, "k-"+r, r, "")
	}
	assert.EqualValues(t, 2, f.metrics.Sum(t, "hybridrate.requests", attribute.String("route", "GET /a")))
	assert.EqualValues(t, 1, f.metrics.Sum(t, "hybridrate.requests", attribute.String("route", "GET /b")))
	assert.EqualValues(t, 2, f.metrics.Sum(t, "hybridrate.requests", attribute.String("route", observe.Other)))
	f.check(t, "no-route", "", "")
	assert.EqualValues(t, 1, f.metrics.Sum(t, "hybridrate.requests", attribute.String("route", observe.None)))
}

func TestHooksSeeEveryDecisionAndHashedDeniedKeys(t *testing.T) {
	var mu sync.Mutex
	var decisions, denials int
	var keys []string
	f := newFixture(t, []observe.Option{
		observe.WithOnDecision(func(ev *observe.Event) { mu.Lock(); decisions++; mu.Unlock() }),
		observe.WithOnDeny(func(ev *observe.Event) {
			mu.Lock()
			defer mu.Unlock()
			denials++
			keys = append(keys, ev.Key)
			assert.Equal(t, "per-key", ev.Result.Rule)
		}),
	})
	for i := 0; i < 7; i++ {
		f.check(t, "alice-raw-key", "", "")
	}
	f.check(t, "bob", "", "")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 8, decisions)
	assert.Equal(t, 2, denials)
	require.Len(t, keys, 2)
	assert.Equal(t, keys[0], keys[1], "one subject, one key")
	assert.Len(t, keys[0], 16)
	assert.NotContains(t, keys[0], "alice")
}

func TestSnapshotMatchesMetrics(t *testing.T) {
	f := newFixture(t, nil)
	for i := 0; i < 10; i++ {
		f.check(t, "hot", "GET /v1/items/{id}", "pro")
	}
	for i := 0; i < 3; i++ {
		f.check(t, "cold-"+string(rune('a'+i)), "GET /v1/items/{id}", "pro")
	}
	s := f.obs.Snapshot(time.Minute)
	assert.Equal(t, f.metrics.Sum(t, "hybridrate.requests", attribute.String("outcome", "denied")), s.Sum.Denied)
	assert.Equal(t, f.metrics.Sum(t, "hybridrate.requests", attribute.String("outcome", "allowed")), s.Sum.Allowed)
	assert.EqualValues(t, 5, s.Sum.Denied)
	assert.Equal(t, s.Sum.Denied, s.Totals.Denied)
	require.Len(t, s.Denied, 1)
	assert.Equal(t, observe.DenyCount{Route: "GET /v1/items/{id}", Rule: "per-key", Tier: "pro", N: 5, Rate: 5.0 / 60}, s.Denied[0])
	require.Len(t, s.TopKeys, 1)
	assert.EqualValues(t, 5, s.TopKeys[0].N)
	var srcTotal int64
	for _, c := range s.Sources {
		srcTotal += c.N
	}
	assert.EqualValues(t, 13, srcTotal)
	assert.True(t, s.Health.OK)
	require.Len(t, s.Health.Limiters, 1)
	assert.Equal(t, "closed", s.Health.Limiters[0].Breaker)
	assert.Len(t, s.Seconds, 60)
}

func TestWindowForgetsOldSeconds(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f := newFixture(t, []observe.Option{observe.WithClock(clock), observe.WithWindow(10 * time.Second)})
	for i := 0; i < 7; i++ {
		f.check(t, "k", "", "")
	}
	assert.EqualValues(t, 2, f.obs.Snapshot(0).Sum.Denied)
	mu.Lock()
	now = now.Add(11 * time.Second)
	mu.Unlock()
	s := f.obs.Snapshot(0)
	assert.Zero(t, s.Sum.Denied, "out of the window")
	assert.EqualValues(t, 2, s.Totals.Denied, "totals keep counting")
}

func TestConfigErrors(t *testing.T) {
	_, err := observe.New(nil)
	assert.Error(t, err)
	for name, opt := range map[string]observe.Option{
		"near limit 2": observe.WithNearLimit(2), "near limit 0": observe.WithNearLimit(0),
		"max labels -1": observe.WithMaxLabels(-1), "window 1s": observe.WithWindow(time.Second),
		"reveal -1": observe.WithRevealSubjects(-1), "nil option": nil,
	} {
		_, err := observe.New(fakeChecker{}, opt)
		assert.ErrorIs(t, err, observe.ErrBadOption, name)
	}
	obs, err := observe.New(fakeChecker{})
	require.NoError(t, err)
	defer obs.Close()
	assert.Error(t, obs.SetPolicy(&policy.Policy{}), "a Checker that takes no policy")
	assert.True(t, obs.Health().OK)
}

type fakeChecker struct{}

func (fakeChecker) Check(context.Context, *policy.Request) (policy.Result, error) {
	return policy.Result{Allowed: true}, nil
}

func TestStrictAndBreakerHealthWhenRedisIsDown(t *testing.T) {
	mr, rdb := redistest.Mini(t, redistest.NoRetries)
	metrics := metrictest.New(t)
	enf := policytest.NewEnforcer(t, rdb,
		policy.WithStrictTimeout(100*time.Millisecond),
		policy.WithHybridOptions(hybrid.WithCheckTimeout(100*time.Millisecond), hybrid.WithMeterProvider(metrics.Provider)),
	)
	obs, err := observe.New(enf, observe.WithMeterProvider(metrics.Provider), observe.WithInstance("n"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = obs.Close() })
	require.NoError(t, obs.SetPolicy(&policy.Policy{Rules: []policy.Rule{
		{ID: "strict", Algorithm: policy.GCRA, Dimensions: []string{"api_key"}, Rate: 1, Burst: 1, OnFailure: outcome.FailOpen},
		{ID: "hyb", Dimensions: []string{"api_key"}, Rate: 1, Burst: 1, OnFailure: outcome.FailOpen},
	}}))
	mr.Close()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; obs.Health().OK; i++ {
		require.True(t, time.Now().Before(deadline), "a breaker opens while Redis is down")
		res, err := obs.Check(context.Background(), &policy.Request{Dims: policy.Values{"api_key": "k" + strconv.Itoa(i)}})
		require.NoError(t, err)
		require.True(t, res.Allowed, "fail-open")
	}
	h := obs.Health()
	assert.False(t, h.OK)
	require.NotNil(t, h.Strict)
	assert.Positive(t, h.Strict.Errors)
	assert.Positive(t, metrics.Sum(t, "hybridrate.strict.errors", attribute.String("class", "error")))
	assert.Positive(t, metrics.Sum(t, "hybridrate.requests", attribute.String("outcome", "allowed")))
	assert.Positive(t, metrics.HistogramCount(t, "hybridrate.check.duration", attribute.String("path", "fallback")),
		"decisions by failure policy are timed on their own path")
	open := metrics.Sum(t, "hybridrate.strict.breaker.state", attribute.String("state", "open")) +
		metrics.Sum(t, "hybridrate.breaker.state", attribute.String("state", "open"))
	assert.Positive(t, open, "an open breaker shows in the metrics")
}

// TestBehindMiddlewareRouteIsThePattern: wrapped by package middleware, the route attribute is the
// mux pattern, never the raw path.
func TestBehindMiddlewareRouteIsThePattern(t *testing.T) {
	f := newFixture(t, nil)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/items/{id}", func(http.ResponseWriter, *http.Request) {})
	mw, err := middleware.New(f.obs, middleware.WithMux(mux))
	require.NoError(t, err)
	h := mw.Handler(mux)
	codes := map[int]int{}
	for i := 0; i < 7; i++ {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/v1/items/"+strconv.Itoa(1000+i), nil)
		req.Header.Set("X-API-Key", "mw-key")
		h.ServeHTTP(rec, req)
		codes[rec.Code]++
	}
	assert.Equal(t, map[int]int{200: 5, 429: 2}, codes)
	route := attribute.String("route", "GET /v1/items/{id}")
	assert.EqualValues(t, 5, f.metrics.Sum(t, "hybridrate.requests", route, attribute.String("outcome", "allowed")))
	assert.EqualValues(t, 2, f.metrics.Sum(t, "hybridrate.requests", route, attribute.String("outcome", "denied")))
}

func TestDeniedKeysPastTheCapAreCountedNotTracked(t *testing.T) {
	now := time.Unix(2_000_000, 0)
	f := newFixture(t, []observe.Option{observe.WithClock(func() time.Time { return now })})
	const keys = 130
	for i := 0; i < keys; i++ {
		for j := 0; j < 6; j++ { // burst 5: one denial per key
			f.check(t, "many-"+strconv.Itoa(i), "", "")
		}
	}
	s := f.obs.Snapshot(0)
	assert.EqualValues(t, keys, s.Sum.Denied)
	assert.Len(t, s.TopKeys, 10)
	for _, k := range s.TopKeys {
		assert.NotEqual(t, observe.Other, k.Key)
	}
	assert.EqualValues(t, keys-128, s.UntrackedKeys)
}
