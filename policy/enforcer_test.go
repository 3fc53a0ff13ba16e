package policy_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/policy/policytest"
)

// env is one test's Redis and Enforcer.
type env struct {
	srv *redistest.Server
	rdb *redis.Client
	enf *policy.Enforcer
}

// exact makes hybrid rules decide every request in Redis (drift 0), so counts are exact.
var exact = []hybrid.Option{hybrid.WithDriftThreshold(0), hybrid.WithCheckTimeout(time.Second)}

// newEnv makes an Enforcer on a fresh redis-server with opts after the tests' defaults: exact hybrid
// rules and a strict timeout of 1s (a loaded test machine must not time out into fallbacks).
func newEnv(t *testing.T, opts []policy.Option, p *policy.Policy) *env {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t, redistest.NoRetries)
	opts = append([]policy.Option{policy.WithHybridOptions(exact...), policy.WithStrictTimeout(time.Second)}, opts...)
	enf := policytest.NewEnforcer(t, rdb, opts...)
	if p != nil {
		require.NoError(t, enf.SetPolicy(p))
	}
	return &env{srv: srv, rdb: rdb, enf: enf}
}

func (e *env) check(t *testing.T, req *policy.Request) policy.Result {
	t.Helper()
	res, err := e.enf.Check(context.Background(), req)
	require.NoError(t, err)
	return res
}

// snapshot returns every key matching pattern with its type and full value.
func (e *env) snapshot(t *testing.T, pattern string) map[string]string {
	t.Helper()
	keys, _ := e.srv.Do(t, "KEYS", pattern).([]any)
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		key := k.(string)
		var v any
		switch typ := e.srv.Do(t, "TYPE", key); typ {
		case "string":
			v = e.srv.Do(t, "GET", key)
		case "hash":
			v = e.srv.Do(t, "HGETALL", key)
		case "zset":
			v = e.srv.Do(t, "ZRANGE", key, 0, -1, "WITHSCORES")
		default:
			v = typ
		}
		out[key] = fmt.Sprint(v)
	}
	return out
}

// consumed returns the tokens a hybrid counter has consumed in total, as Redis knows it.
func (e *env) consumed(t *testing.T, key string) int64 {
	t.Helper()
	// One bucket per key, whatever its limit (central.BucketKey).
	b, err := e.rdb.HGet(context.Background(), central.BucketKey("hr", key), central.BucketField).Result()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	require.NoError(t, err)
	st, err := central.ParseBucket(b)
	require.NoError(t, err)
	return st.Consumed
}

func req(method, route string, kv ...string) *policy.Request {
	v := policy.Values{"route": route}
	for i := 0; i+1 < len(kv); i += 2 {
		v[kv[i]] = kv[i+1]
	}
	return &policy.Request{Method: method, Dims: v}
}

func units(res policy.Result) []string {
	var out []string
	for _, d := range res.Decisions {
		s := d.Unit + ":" + map[bool]string{true: "allow", false: "deny"}[d.Allowed] + ":" + d.Source.String()
		if d.Shadow {
			s += ":shadow"
		}
		out = append(out, s)
	}
	return out
}

func TestHierarchyStrictDenialConsumesNothing(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "global", Algorithm: policy.FixedWindow, Limit: 100, Period: time.Hour},
		{ID: "tenant", Algorithm: policy.GCRA, Dimensions: []string{"tenant"}, Limit: 10, Period: time.Hour},
		{ID: "endpoint", Algorithm: policy.SlidingLog, Dimensions: []string{"tenant", "route"}, Limit: 2, Period: time.Hour,
			Match: policy.Match{Routes: []string{"POST /export"}}},
	}}
	e := newEnv(t, nil, p)
	export := req("POST", "POST /export", "tenant", "acme")
	for i := 0; i < 2; i++ {
		res := e.check(t, export)
		require.True(t, res.Allowed, "export %d: %v", i, units(res))
	}
	before := e.snapshot(t, "hr:*")
	require.Len(t, before, 4, "global, tenant, and the endpoint's log and its hash: %v", before)

	res := e.check(t, export)
	assert.False(t, res.Allowed)
	assert.Equal(t, "endpoint", res.Rule)
	assert.Greater(t, res.RetryAfter, 59*time.Minute)
	assert.Equal(t, []string{"global:allow:strict", "tenant:allow:strict", "endpoint:deny:strict"}, units(res),
		"every strict rule is checked in one call")
	assert.Equal(t, before, e.snapshot(t, "hr:*"), "a denial by one rule wrote nothing to any rule's counter")

	// The retry is answered by the memo: nothing is asked or written.
	res = e.check(t, export)
	assert.False(t, res.Allowed)
	assert.Equal(t, []string{"endpoint:deny:memo"}, units(res))
	assert.Equal(t, before, e.snapshot(t, "hr:*"))

	// Another route of the same tenant passes, and global and tenant count 3.
	res = e.check(t, req("GET", "GET /items", "tenant", "acme"))
	require.True(t, res.Allowed)
	assert.Equal(t, []string{"global:allow:strict", "tenant:allow:strict"}, units(res))
	assert.Equal(t, int64(97), res.Decisions[0].Remaining)
	assert.Equal(t, int64(7), res.Decisions[1].Remaining)
}

func TestHierarchyHybridDenialConsumesNothingAfterIt(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{
		// Listed first, evaluated after per-key: the narrowest hybrid rule goes first.
		{ID: "global", Rate: 1000, Burst: 1000},
		{ID: "per-key", Dimensions: []string{"api_key"}, Rate: 0.001, Burst: 2},
		{ID: "tenant", Algorithm: policy.GCRA, Dimensions: []string{"tenant"}, Limit: 100, Period: time.Hour},
	}}
	e := newEnv(t, nil, p)
	r := req("GET", "GET /", "api_key", "k1", "tenant", "acme")
	for i := 0; i < 2; i++ {
		res := e.check(t, r)
		require.True(t, res.Allowed, "request %d: %v", i, units(res))
		assert.Equal(t, []string{"per-key:allow:central", "global:allow:central", "tenant:allow:strict"}, units(res))
	}
	strictBefore := e.snapshot(t, "hr:v1:{policy}:*")
	res := e.check(t, r)
	assert.False(t, res.Allowed)
	assert.Equal(t, "per-key", res.Rule)
	assert.Equal(t, []string{"per-key:deny:central"}, units(res))
	assert.Equal(t, strictBefore, e.snapshot(t, "hr:v1:{policy}:*"), "the strict rule counted nothing")
	assert.Equal(t, int64(2), e.consumed(t, "global:*"), "the broader hybrid rule counted nothing")
	assert.Equal(t, int64(2), e.consumed(t, "per-key:api_key=k1"))
}

func TestHierarchyStrictDenialLeavesAtMostOneHybridCharge(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "per-key", Dimensions: []string{"api_key"}, Rate: 1000, Burst: 1000},
		{ID: "tenant", Algorithm: policy.GCRA, Dimensions: []string{"tenant"}, Limit: 1, Period: time.Hour},
	}}
	e := newEnv(t, nil, p)
	r := req("GET", "GET /", "api_key", "k1", "tenant", "acme")
	require.True(t, e.check(t, r).Allowed)
	assert.Equal(t, int64(1), e.consumed(t, "per-key:api_key=k1"))

	// The hybrid rule consulted before the strict denial took its charge in Redis and gave it back to
	// this process's allowance for the key (TestDeniedRequestKeepsNoHybridCharge shows it is used
	// again); Redis's count shows it until that allowance is used or expires...
	res := e.check(t, r)
	assert.False(t, res.Allowed)
	assert.Equal(t, []string{"per-key:allow:central", "tenant:deny:strict"}, units(res))
	assert.Equal(t, int64(2), e.consumed(t, "per-key:api_key=k1"))
	assert.Zero(t, e.enf.Stats().Unrefunded)
	// ...once: retries within the retry-after are answered by the memo and charge nothing.
	for i := 0; i < 5; i++ {
		res = e.check(t, r)
		assert.False(t, res.Allowed)
		assert.Equal(t, []string{"tenant:deny:memo"}, units(res))
	}
	assert.Equal(t, int64(2), e.consumed(t, "per-key:api_key=k1"))
	assert.Equal(t, int64(5), e.enf.Stats().Memo)
}

func TestTiers(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{
		DefaultTier: "free",
		Tiers: map[string]policy.Tier{
			"free": {PerMinute: 3, PerHour: 100},
			"pro":  {PerMinute: 10, PerHour: 1000},
		},
		Rules: []policy.Rule{
			{ID: "per-key", Dimensions: []string{"api_key"}, Tiered: true},
			{ID: "per-key-strict", Algorithm: policy.FixedWindow, Dimensions: []string{"api_key"}, Tiered: true,
				Match: policy.Match{Tiers: []string{"pro"}}},
		},
	}
	e := newEnv(t, nil, p)
	count := func(tier, key string, n int) (allowed int, last policy.Result) {
		for i := 0; i < n; i++ {
			r := req("GET", "GET /", "api_key", key)
			r.Tier = tier
			last = e.check(t, r)
			if last.Allowed {
				allowed++
			}
		}
		return allowed, last
	}
	allowed, last := count("free", "free-key", 5)
	assert.Equal(t, 3, allowed, "free: 3 per minute")
	assert.Equal(t, "per-key", last.Rule)
	assert.Equal(t, "per-key.minute", last.Decisions[0].Unit)
	assert.Equal(t, int64(3), last.Decisions[0].Limit)
	assert.Equal(t, time.Minute, last.Decisions[0].Window)

	allowed, last = count("", "no-tier-key", 5)
	assert.Equal(t, 3, allowed, "no tier: the default tier")
	allowed, _ = count("platinum", "unknown-tier-key", 5)
	assert.Equal(t, 3, allowed, "unknown tier: the default tier")

	allowed, last = count("pro", "pro-key", 12)
	assert.Equal(t, 10, allowed, "pro: 10 per minute")
	assert.Equal(t, []string{"per-key.minute:deny:memo"}, units(last),
		"the 11th was denied by the hybrid rule (before the strict one), the 12th by the memo of that denial")

	_, last = count("pro", "pro-key-2", 1)
	assert.Equal(t, []string{"per-key.minute:allow:central", "per-key.hour:allow:central",
		"per-key-strict.minute:allow:strict", "per-key-strict.hour:allow:strict"}, units(last))
	assert.Equal(t, int64(1000), last.Decisions[1].Limit)
}

// shadowEvents records the events of policy.WithOnShadowDeny; it is safe for concurrent use.
type shadowEvents struct {
	mu  sync.Mutex
	evs []policy.ShadowEvent // guarded by mu
}

func (r *shadowEvents) add(ev policy.ShadowEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, ev)
}

// all returns a copy of the events so far.
func (r *shadowEvents) all() []policy.ShadowEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]policy.ShadowEvent(nil), r.evs...)
}

func TestShadowRule(t *testing.T) {
	t.Parallel()
	var rec shadowEvents
	cfg := []policy.Option{policy.WithOnShadowDeny(rec.add)}
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "enforced", Dimensions: []string{"api_key"}, Rate: 1000, Burst: 1000},
		{ID: "try-strict", Algorithm: policy.SlidingLog, Dimensions: []string{"api_key"}, Limit: 1, Period: time.Hour, Shadow: true},
		{ID: "try-hybrid", Dimensions: []string{"api_key"}, Rate: 0.001, Burst: 2, Shadow: true},
	}}
	e := newEnv(t, cfg, p)
	r := req("GET", "GET /", "api_key", "k1")
	for i := 0; i < 3; i++ {
		res := e.check(t, r)
		require.True(t, res.Allowed, "a shadow rule never denies")
		assert.False(t, res.ShadowDenied)
		assert.Len(t, res.Decisions, 3)
	}
	events := rec.all()
	var got []string
	for _, ev := range events {
		assert.False(t, ev.Global)
		assert.True(t, ev.Decision.Shadow)
		assert.False(t, ev.Decision.Allowed)
		got = append(got, ev.Rule)
	}
	assert.Equal(t, []string{"try-strict", "try-strict", "try-hybrid"}, got)
	assert.Equal(t, int64(3), e.enf.Stats().ShadowDenied)
	assert.Equal(t, "try-strict:api_key=k1", events[0].Key)
	assert.Equal(t, int64(0), e.enf.Stats().Denied)
}

func TestShadowPolicy(t *testing.T) {
	t.Parallel()
	var rec shadowEvents
	cfg := []policy.Option{policy.WithOnShadowDeny(rec.add)}
	p := &policy.Policy{Shadow: true, Rules: []policy.Rule{
		{ID: "per-key", Dimensions: []string{"api_key"}, Rate: 0.001, Burst: 1},
		{ID: "tenant", Algorithm: policy.GCRA, Dimensions: []string{"tenant"}, Limit: 2, Period: time.Hour},
	}}
	e := newEnv(t, cfg, p)
	var shadowDenied []bool
	for i := 0; i < 3; i++ {
		res := e.check(t, req("GET", "GET /", "api_key", fmt.Sprint("k", i%2), "tenant", "acme"))
		require.True(t, res.Allowed, "a policy in shadow mode admits everything")
		shadowDenied = append(shadowDenied, res.ShadowDenied)
	}
	// k0 passes; k1 passes; k0 again: per-key denies (would have).
	assert.Equal(t, []bool{false, false, true}, shadowDenied)
	// A request without the key per-key rejects passes too, and is reported; tenant is still
	// evaluated, and its limit of 2 is spent (the third request was stopped by per-key first).
	res := e.check(t, req("GET", "GET /", "tenant", "acme"))
	assert.True(t, res.Allowed)
	assert.True(t, res.ShadowDenied)
	events := rec.all()
	require.Len(t, events, 3)
	for _, ev := range events {
		assert.True(t, ev.Global)
	}
	assert.Equal(t, "per-key", events[0].Rule)
	assert.Equal(t, "per-key:api_key=k0", events[0].Key)
	assert.Equal(t, "per-key", events[1].Rule)
	assert.True(t, events[1].MissingKey)
	assert.Equal(t, "tenant", events[2].Rule)
	assert.Equal(t, "tenant:tenant=acme", events[2].Key)
}

func TestMissingKey(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "reject", Dimensions: []string{"api_key"}, Rate: 1000, Burst: 1000, Match: policy.Match{Routes: []string{"/reject"}}},
		{ID: "shared", Dimensions: []string{"api_key", "tenant"}, Rate: 0.001, Burst: 2, MissingKey: policy.MissingShared,
			Match: policy.Match{Routes: []string{"/shared"}}},
		{ID: "skip", Dimensions: []string{"api_key"}, Rate: 0.001, Burst: 1, MissingKey: policy.MissingSkip,
			Match: policy.Match{Routes: []string{"/skip"}}},
	}}
	e := newEnv(t, nil, p)

	res := e.check(t, req("GET", "/reject", "tenant", "acme"))
	assert.False(t, res.Allowed)
	assert.True(t, res.MissingKey)
	assert.Equal(t, "reject", res.Rule)
	assert.Empty(t, res.Decisions, "nothing was consulted")
	res = e.check(t, req("GET", "/reject", "api_key", strings.Repeat("x", policy.MaxValueLen+1)))
	assert.True(t, res.Allowed, "a value longer than MaxValueLen is not missing: it counts under its hash")
	assert.False(t, res.MissingKey)

	// Anonymous requests of one tenant share one bucket of 2.
	var got []bool
	for i := 0; i < 3; i++ {
		got = append(got, e.check(t, req("GET", "/shared", "tenant", "acme")).Allowed)
	}
	assert.Equal(t, []bool{true, true, false}, got)
	assert.Equal(t, int64(2), e.consumed(t, "shared:api_key=*,tenant=acme"))
	assert.True(t, e.check(t, req("GET", "/shared", "tenant", "other")).Allowed, "another tenant's anonymous bucket")
	assert.True(t, e.check(t, req("GET", "/shared", "tenant", "acme", "api_key", "*")).Allowed,
		"a real value \"*\" is escaped and never shares the anonymous bucket")

	for i := 0; i < 3; i++ {
		res := e.check(t, req("GET", "/skip"))
		assert.True(t, res.Allowed)
		assert.Empty(t, res.Decisions)
	}
	assert.Equal(t, int64(1), e.enf.Stats().MissingKey)
}

func TestHashedSubjectsKeepRawValuesOutOfRedis(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{StrictTag: "tenant", Rules: []policy.Rule{
		{ID: "per-key", Dimensions: []string{"api_key"}, Rate: 10, Burst: 10},
		{ID: "per-user", Algorithm: policy.SlidingWindow, Dimensions: []string{"user", "tenant"}, Limit: 10, Period: time.Minute},
		{ID: "per-ip", Algorithm: policy.GCRA, Dimensions: []string{"ip", "tenant"}, Limit: 10, Period: time.Minute},
	}}
	e := newEnv(t, []policy.Option{policy.WithHashKey([]byte("0123456789abcdef0123456789abcdef"))}, p)
	raw := []string{"sk_live_SECRET", "alice@example.com", "203.0.113.7", "acme-corp"}
	res := e.check(t, req("GET", "/", "api_key", raw[0], "user", raw[1], "ip", raw[2], "tenant", raw[3]))
	require.True(t, res.Allowed, units(res))
	keys, _ := e.srv.Do(t, "KEYS", "*").([]any)
	require.NotEmpty(t, keys)
	for _, k := range keys {
		for _, v := range raw {
			assert.NotContains(t, k, v)
		}
	}
	var names []string
	for _, k := range keys {
		names = append(names, k.(string))
	}
	sort.Strings(names)
	t.Logf("keys: %v", names)
}

func TestCosts(t *testing.T) {
	t.Parallel()
	cfg := []policy.Option{
		policy.WithCostFuncs(map[string]policy.CostFunc{
			"size": func(r *policy.Request) int64 {
				v, _ := r.Dims.Dimension("size")
				return int64(len(v))
			},
		}),
		policy.WithDimensions("size"),
	}
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "methods", Algorithm: policy.FixedWindow, Limit: 10, Period: time.Hour,
			Cost: policy.Cost{Fixed: 2, PerMethod: map[string]int64{"POST": 5}}, Match: policy.Match{Routes: []string{"/m"}}},
		{ID: "func", Rate: 0.001, Burst: 10, Cost: policy.Cost{FuncName: "size"}, Match: policy.Match{Routes: []string{"/f"}}},
	}}
	e := newEnv(t, cfg, p)
	remaining := func(r *policy.Request) int64 {
		res := e.check(t, r)
		require.True(t, res.Allowed)
		return res.Decisions[0].Remaining
	}
	assert.Equal(t, int64(5), remaining(req("POST", "/m")))
	assert.Equal(t, int64(3), remaining(req("GET", "/m")), "other methods cost the default")
	assert.Equal(t, int64(7), remaining(req("GET", "/f", "size", "xxx")))

	_, err := e.enf.Check(context.Background(), req("GET", "/f", "size", ""))
	assert.ErrorIs(t, err, policy.ErrInvalidCost, "a cost function answering 0")
	_, err = e.enf.Check(context.Background(), req("GET", "/f", "size", strings.Repeat("x", 11)))
	assert.ErrorIs(t, err, policy.ErrInvalidCost, "a cost above the burst")
	assert.Equal(t, int64(3), e.consumed(t, "func:*"), "invalid costs consumed nothing")
}

func TestFailurePolicyPerRuleWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	route := func(r string) policy.Match { return policy.Match{Routes: []string{r}} }
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "h-open", Rate: 0.001, Burst: 1, OnFailure: outcome.FailOpen, Match: route("/h-open")},
		{ID: "h-closed", Rate: 1000, Burst: 1000, OnFailure: outcome.FailClosed, Match: route("/h-closed")},
		{ID: "h-local", Rate: 0.001, Burst: 2, OnFailure: outcome.LocalFallback, Match: route("/h-local")},
		{ID: "s-open", Algorithm: policy.GCRA, Limit: 1, Period: time.Hour, OnFailure: outcome.FailOpen, Match: route("/s-open")},
		{ID: "s-closed", Algorithm: policy.GCRA, Limit: 1000, Period: time.Hour, OnFailure: outcome.FailClosed, Match: route("/s-closed")},
		{ID: "s-local", Algorithm: policy.SlidingLog, Limit: 2, Period: time.Hour, Match: route("/s-local")},
		{ID: "s-pair-open", Algorithm: policy.GCRA, Limit: 1000, Period: time.Hour, OnFailure: outcome.FailOpen, Match: route("/pair")},
		{ID: "s-pair-local", Algorithm: policy.FixedWindow, Limit: 1, Period: time.Hour, Match: route("/pair")},
	}}
	e := newEnv(t, nil, p)
	// Redis up: everything works, and the one-token rules are spent.
	for _, r := range []string{"/h-open", "/h-closed", "/h-local", "/s-open", "/s-closed", "/s-local", "/pair"} {
		require.True(t, e.check(t, req("GET", r)).Allowed, r)
	}
	require.False(t, e.check(t, req("GET", "/h-open")).Allowed)
	require.False(t, e.check(t, req("GET", "/s-open")).Allowed)

	e.srv.Kill(t)
	allowed := func(route string, n int) []bool {
		var out []bool
		for i := 0; i < n; i++ {
			res := e.check(t, req("GET", route))
			out = append(out, res.Allowed)
			if !res.Allowed && route != "/pair" {
				assert.Equal(t, strings.TrimPrefix(route, "/"), res.Rule)
			}
			if !res.Allowed {
				assert.Positive(t, res.RetryAfter)
			}
			require.NotEmpty(t, res.Decisions)
			last := res.Decisions[len(res.Decisions)-1]
			assert.Contains(t, []outcome.Source{outcome.SourceFallback, outcome.SourceMemo, outcome.SourceDenyCache}, last.Source,
				"%s: %v", route, units(res))
		}
		return out
	}
	// (Fail-open, which admits past a spent limit, is TestFailOpenWhenRedisIsDown.)
	assert.Equal(t, []bool{false, false, false}, allowed("/h-closed", 3), "fail_closed denies")
	// outcome.LocalFallback starts from what Redis last reported of the bucket (issue 26), not a fresh
	// burst: one of the burst of 2 was taken while Redis was up (every decision goes to Redis
	// here: drift 0), so one is left.
	assert.Equal(t, []bool{true, false, false}, allowed("/h-local", 3), "local_fallback enforces what is left of its burst of 2 locally")
	assert.Equal(t, []bool{false, false}, allowed("/s-closed", 2), "strict fail_closed denies")
	assert.Equal(t, []bool{true, true, false}, allowed("/s-local", 3), "strict local_fallback: 2 per hour locally")
	// s-open's denial is in the memo until its retry-after; the memo is per process and still right.
	res := e.check(t, req("GET", "/s-open"))
	assert.False(t, res.Allowed)
	assert.Equal(t, outcome.SourceMemo, res.Decisions[0].Source)
	// A pair of strict rules, one fail-open and one local (1 per hour): all or nothing locally too.
	assert.Equal(t, []bool{true, false}, allowed("/pair", 2))
	assert.Positive(t, e.enf.Stats().Fallback)
}

func TestFailOpenWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "h-open", Dimensions: []string{"api_key"}, Rate: 0.001, Burst: 1, OnFailure: outcome.FailOpen},
		{ID: "s-open", Algorithm: policy.GCRA, Dimensions: []string{"api_key"}, Limit: 1, Period: time.Hour, OnFailure: outcome.FailOpen},
	}}
	e := newEnv(t, nil, p)
	e.srv.Kill(t)
	for i := 0; i < 3; i++ {
		res := e.check(t, req("GET", "/", "api_key", "k"))
		assert.True(t, res.Allowed, "fail_open admits past the limit while Redis is down: %v", units(res))
		assert.Equal(t, []string{"h-open:allow:fallback", "s-open:allow:fallback"}, units(res))
	}
}

func TestMatch(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{DefaultTier: "free", Tiers: map[string]policy.Tier{"free": {PerMinute: 1}, "pro": {PerMinute: 1}},
		Rules: []policy.Rule{
			{ID: "writes", Rate: 1, Burst: 1, Match: policy.Match{Methods: []string{"post", "PUT"}}},
			{ID: "route", Rate: 1, Burst: 1, Match: policy.Match{Routes: []string{"GET /a"}}},
			{ID: "pro", Rate: 1, Burst: 1, Match: policy.Match{Tiers: []string{"pro"}}},
		}}
	e := newEnv(t, nil, p)
	ids := func(r *policy.Request) []string {
		var out []string
		for _, d := range e.check(t, r).Decisions {
			out = append(out, d.Rule)
		}
		return out
	}
	assert.Equal(t, []string{"writes"}, ids(req("POST", "POST /b")))
	assert.Equal(t, []string{"route"}, ids(req("GET", "GET /a")))
	assert.Empty(t, ids(&policy.Request{Method: "GET"}), "no route: route rules do not match")
	pro := req("GET", "GET /c")
	pro.Tier = "pro"
	assert.Equal(t, []string{"pro"}, ids(pro))
}

func TestEnforcerErrorsAndReplacement(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []policy.Option{policy.WithDimensions("region")}, nil)
	_, err := e.enf.Check(context.Background(), req("GET", "/"))
	assert.ErrorIs(t, err, policy.ErrNoPolicy)

	require.NoError(t, e.enf.SetPolicy(&policy.Policy{Rules: []policy.Rule{{ID: "a", Dimensions: []string{"region"}, Rate: 0.001, Burst: 1}}}))
	// An invalid replacement names the line and leaves the policy in force.
	bad, err := policy.Parse([]byte("rules:\n  - id: a\n    dimensions: [planet]\n    rate: 1\n    burst: 1\n"), "p.yaml")
	require.NoError(t, err, "planet is a well-formed dimension name")
	err = e.enf.SetPolicy(bad)
	require.ErrorIs(t, err, policy.ErrInvalid)
	assert.True(t, strings.HasPrefix(err.Error(), `p.yaml:3:5: rule "a": dimension "planet": unknown dimension`), err.Error())
	err = e.enf.SetPolicy(&policy.Policy{Rules: []policy.Rule{{ID: "a", Rate: 1, Burst: 1, Cost: policy.Cost{FuncName: "nope"}}}})
	assert.ErrorContains(t, err, `cost function "nope" is not in WithCostFuncs`)
	assert.Equal(t, "a", e.enf.Policy().Rules[0].ID)
	assert.Equal(t, []string{"region"}, e.enf.Policy().Rules[0].Dimensions)

	assert.True(t, e.check(t, req("GET", "/", "region", "eu")).Allowed)
	assert.False(t, e.check(t, req("GET", "/", "region", "eu")).Allowed)

	_, err = policy.NewEnforcer(nil)
	assert.ErrorIs(t, err, policy.ErrBadOption, "nil Redis")
	_, err = policy.NewEnforcer(e.rdb, policy.WithDimensions("Bad-Name"))
	assert.Error(t, err)
	_, err = policy.NewEnforcer(e.rdb, policy.WithCostFuncs(map[string]policy.CostFunc{"x": nil}))
	assert.Error(t, err)

	require.NoError(t, e.enf.Close(context.Background()))
	require.NoError(t, e.enf.Close(context.Background()), "Close twice")
	_, err = e.enf.Check(context.Background(), req("GET", "/"))
	assert.ErrorIs(t, err, policy.ErrClosed)
	assert.ErrorIs(t, e.enf.SetPolicy(&policy.Policy{}), policy.ErrClosed)
}

func TestCheckCancelledContext(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, &policy.Policy{Rules: []policy.Rule{{ID: "a", Rate: 1, Burst: 1}}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.enf.Check(ctx, req("GET", "/"))
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, int64(1), e.enf.Stats().Errors)
}

func TestConcurrentChecksAndPolicyChanges(t *testing.T) {
	t.Parallel()
	a := &policy.Policy{Rules: []policy.Rule{
		{ID: "h", Dimensions: []string{"api_key"}, Rate: 1000, Burst: 1000},
		{ID: "s", Algorithm: policy.GCRA, Dimensions: []string{"api_key"}, Limit: 1000, Period: time.Second},
	}}
	b := &policy.Policy{Shadow: true, Rules: []policy.Rule{
		{ID: "h", Dimensions: []string{"api_key"}, Rate: 10, Burst: 10, OnFailure: outcome.FailOpen},
		{ID: "s2", Algorithm: policy.SlidingWindow, Limit: 5, Period: time.Second, Shadow: true},
	}}
	e := newEnv(t, []policy.Option{policy.WithHybridOptions(hybrid.WithCheckTimeout(time.Second))}, a)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				_, err := e.enf.Check(context.Background(), req("GET", "/", "api_key", fmt.Sprint("k", g, i%7)))
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for i := 0; ctx.Err() == nil; i++ {
		p := a
		if i%2 == 1 {
			p = b
		}
		require.NoError(t, e.enf.SetPolicy(p))
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
}

func TestCompositeKeysAreStableAndUnambiguous(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{{ID: "r", Dimensions: []string{"tenant", "api_key"}, Rate: 0.001, Burst: 10}}}
	e := newEnv(t, nil, p)
	require.True(t, e.check(t, req("GET", "/", "api_key", "k", "tenant", "acme")).Allowed)
	assert.Equal(t, int64(1), e.consumed(t, "r:api_key=k,tenant=acme"), "dimensions in sorted order, whatever the rule's order")

	// The same rule with its dimensions listed the other way round keeps the counter.
	require.NoError(t, e.enf.SetPolicy(&policy.Policy{Rules: []policy.Rule{{ID: "r", Dimensions: []string{"api_key", "tenant"}, Rate: 0.001, Burst: 10}}}))
	require.True(t, e.check(t, req("GET", "/", "api_key", "k", "tenant", "acme")).Allowed)
	assert.Equal(t, int64(2), e.consumed(t, "r:api_key=k,tenant=acme"))

	// Values that would collide if joined naively get distinct counters.
	require.True(t, e.check(t, req("GET", "/", "api_key", "x,tenant=y", "tenant", "z")).Allowed)
	require.True(t, e.check(t, req("GET", "/", "api_key", "x", "tenant", "y,tenant=z")).Allowed)
	assert.Equal(t, int64(1), e.consumed(t, "r:api_key=x%2Ctenant%3Dy,tenant=z"))
	assert.Equal(t, int64(1), e.consumed(t, "r:api_key=x,tenant=y%2Ctenant%3Dz"))
	// Braces cannot end a hash tag early, and a value of "*" is not the anonymous bucket.
	require.True(t, e.check(t, req("GET", "/", "api_key", "{a}", "tenant", "*")).Allowed)
	assert.Equal(t, int64(1), e.consumed(t, "r:api_key=%7Ba%7D,tenant=%2A"))
}

func TestLimitersAndStrictHealth(t *testing.T) {
	_, rdb := redistest.Mini(t)
	enf := policytest.NewEnforcer(t, rdb,
		policy.WithStrictTimeout(time.Second),
		policy.WithHybridOptions(hybrid.WithCheckTimeout(time.Second)),
	)
	assert.Nil(t, enf.Limiter(), "no limiter before a policy needs one")
	require.NoError(t, enf.SetPolicy(&policy.Policy{Rules: []policy.Rule{
		{ID: "h", Rate: 10, Burst: 10},
		{ID: "s", Algorithm: policy.GCRA, Rate: 10, Burst: 10, OnFailure: outcome.FailOpen},
	}}))
	assert.NotNil(t, enf.Limiter())
	_, err := enf.Check(context.Background(), &policy.Request{})
	require.NoError(t, err)
	h := enf.StrictHealth()
	assert.Positive(t, h.Calls)
	assert.Zero(t, h.Errors)
	assert.Equal(t, "closed", h.Breaker)
}

// TestOneHybridLimiterServesEveryFailurePolicy: hybrid rules of the three failure policies share the
// Enforcer's one hybrid limiter, and with Redis stopped each rule still answers by its own policy.
// (Not parallel: it counts limiters through a package variable.)
func TestOneHybridLimiterServesEveryFailurePolicy(t *testing.T) {
	created := policy.CountHybridLimiters(t)
	route := func(r string) policy.Match { return policy.Match{Routes: []string{r}} }
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "open", Rate: 0.001, Burst: 1, OnFailure: outcome.FailOpen, Match: route("/open")},
		{ID: "closed", Rate: 1000, Burst: 1000, OnFailure: outcome.FailClosed, Match: route("/closed")},
		{ID: "local", Rate: 0.001, Burst: 2, OnFailure: outcome.LocalFallback, Match: route("/local")},
		{ID: "default", Rate: 0.001, Burst: 1, Match: route("/default")}, // outcome.LocalFallback
		{ID: "strict", Algorithm: policy.GCRA, Limit: 1000, Period: time.Hour, OnFailure: outcome.FailClosed, Match: route("/strict")},
	}}
	// The limiter's own default does not reach the rules: a rule without on_failure falls back locally.
	opts := append(append([]hybrid.Option(nil), exact...), hybrid.WithFailurePolicy(outcome.FailOpen))
	e := newEnv(t, []policy.Option{policy.WithHybridOptions(opts...)}, p)
	require.NoError(t, e.enf.SetPolicy(p), "a second policy reuses the limiter")
	assert.Equal(t, int64(1), created.Load(), "one hybrid limiter for every failure policy")
	assert.NotNil(t, e.enf.Limiter())

	e.srv.Kill(t)
	answers := func(route string, n int) (allowed []bool, sources []outcome.Source, unavailable []bool) {
		for range n {
			res := e.check(t, req("GET", route))
			require.NotEmpty(t, res.Decisions, route)
			d := res.Decisions[0]
			allowed, sources, unavailable = append(allowed, res.Allowed), append(sources, d.Source), append(unavailable, res.Unavailable)
		}
		return allowed, sources, unavailable
	}
	fb, memo := outcome.SourceFallback, outcome.SourceMemo
	for _, tc := range []struct {
		route       string
		allowed     []bool
		sources     []outcome.Source
		unavailable []bool
	}{
		{"/open", []bool{true, true, true}, []outcome.Source{fb, fb, fb}, []bool{false, false, false}},
		{"/closed", []bool{false, false}, []outcome.Source{fb, fb}, []bool{true, true}},
		// The local bucket holds the burst; its denial is then remembered until its retry-after.
		{"/local", []bool{true, true, false, false}, []outcome.Source{fb, fb, fb, memo}, []bool{false, false, false, false}},
		{"/default", []bool{true, false}, []outcome.Source{fb, fb}, []bool{false, false}},
		{"/strict", []bool{false}, []outcome.Source{fb}, []bool{true}},
	} {
		allowed, sources, unavailable := answers(tc.route, len(tc.allowed))
		assert.Equal(t, tc.allowed, allowed, "%s: allowed", tc.route)
		assert.Equal(t, tc.sources, sources, "%s: sources", tc.route)
		assert.Equal(t, tc.unavailable, unavailable, "%s: unavailable", tc.route)
	}
	assert.Equal(t, int64(1), created.Load())
	require.NotNil(t, e.enf.Limiter())
	assert.Equal(t, outcome.FailOpen, e.enf.Limiter().FailurePolicy(), "the limiter keeps the default it was given")
}
