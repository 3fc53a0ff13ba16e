package policy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/policy"
)

// TestNoValueTakesARequestOutOfItsRule is issue 23's first defect: a value longer than MaxValueLen
// counted as missing, so under missing_key: skip a 300-byte api_key escaped a rule that denied a
// 250-byte one after 4. Every value, whatever its length or bytes, is now limited like any other.
func TestNoValueTakesARequestOutOfItsRule(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 300)
	values := map[string]string{
		"250 bytes":                     strings.Repeat("k", 250),
		"256 bytes":                     strings.Repeat("k", policy.MaxValueLen),
		"257 bytes":                     strings.Repeat("k", policy.MaxValueLen+1),
		"300 bytes":                     long,
		"300 bytes, another last byte":  long[:299] + "x", // same first 256 bytes: its own subject
		"1 MB":                          strings.Repeat("m", 1<<20),
		"NUL bytes":                     "a\x00b\x00",
		"invalid UTF-8":                 "\xff\xfe\xc3",
		"long with NUL and invalid UTF": strings.Repeat("\x00\xff", 200),
	}
	for _, algo := range []policy.Algorithm{policy.Hybrid, policy.GCRA, policy.FixedWindow} {
		t.Run(string(algo), func(t *testing.T) {
			t.Parallel()
			rule := policy.Rule{ID: "per-key", Algorithm: algo, Dimensions: []string{"api_key"}, Limit: 4, Period: time.Hour}
			p := &policy.Policy{MissingKey: policy.MissingSkip, StrictTag: "", Rules: []policy.Rule{rule}}
			e := newEnv(t, nil, p)
			for name, v := range values {
				var got []bool
				for i := 0; i < 6; i++ {
					got = append(got, e.check(t, req("GET", "/", "api_key", v)).Allowed)
				}
				assert.Equal(t, []bool{true, true, true, true, false, false}, got, "%s: limited like any value", name)
			}
			assert.Equal(t, int64(5*6), e.enf.Stats().LongValues, "the five long values, at every request")
		})
	}
	t.Run("strict tag", func(t *testing.T) {
		t.Parallel()
		p := &policy.Policy{MissingKey: policy.MissingSkip, StrictTag: "tenant", Rules: []policy.Rule{
			{ID: "per-tenant", Algorithm: policy.GCRA, Dimensions: []string{"tenant"}, Limit: 2, Period: time.Hour}}}
		e := newEnv(t, []policy.Option{policy.WithHashKey([]byte("k"))}, p)
		for _, v := range []string{long, long[:299] + "x"} {
			var got []bool
			for i := 0; i < 3; i++ {
				got = append(got, e.check(t, req("GET", "/", "tenant", v)).Allowed)
			}
			assert.Equal(t, []bool{true, true, false}, got)
		}
	})
}

// TestDomainsNamespaceCounters is issue 23's third defect: a key denied in domain "api" was also
// denied in "totally-other-service", and counted there.
func TestDomainsNamespaceCounters(t *testing.T) {
	t.Parallel()
	rules := []policy.Rule{
		{ID: "per-key", Dimensions: []string{"api_key"}, Limit: 2, Period: time.Hour},
		{ID: "strict-key", Algorithm: policy.GCRA, Dimensions: []string{"api_key"}, Limit: 3, Period: time.Hour},
	}
	check := func(e *env, domain string) bool {
		r := req("GET", "/", "api_key", "k1")
		r.Domain = domain
		return e.check(t, r).Allowed
	}
	t.Run("a policy for every domain", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil, &policy.Policy{Rules: rules})
		assert.Equal(t, []bool{true, true, false}, []bool{check(e, "api"), check(e, "api"), check(e, "api")})
		assert.Equal(t, []bool{true, true, false}, []bool{check(e, "totally-other-service"),
			check(e, "totally-other-service"), check(e, "totally-other-service")}, "its own counters")
		assert.Equal(t, []bool{true, true, false}, []bool{check(e, ""), check(e, ""), check(e, "")},
			"no domain: its own counters too")
		assert.Equal(t, int64(2), e.consumed(t, "per-key:api|api_key=k1"))
	})
	t.Run("a policy that names its domain", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil, &policy.Policy{Domain: "api", Rules: rules})
		assert.Equal(t, []bool{true, true, false}, []bool{check(e, "api"), check(e, ""), check(e, "api")},
			"an empty domain counts under the policy's")
		_, err := e.enf.Check(context.Background(), &policy.Request{Domain: "totally-other-service",
			Dims: policy.Values{"api_key": "k1"}})
		assert.ErrorIs(t, err, policy.ErrUnknownDomain)
		assert.ErrorContains(t, err, `"totally-other-service" (the policy serves "api")`)

		require.NoError(t, e.enf.SetPolicy(&policy.Policy{Domain: "api", UnknownDomain: policy.DomainAllow, Rules: rules}))
		for i := 0; i < 5; i++ {
			res := e.check(t, &policy.Request{Domain: "other", Dims: policy.Values{"api_key": "k1"}})
			assert.True(t, res.Allowed, "no limit for another domain")
			assert.Empty(t, res.Decisions)
		}
		assert.False(t, check(e, "api"), "the policy's own domain is still limited")
	})
	t.Run("the file form", func(t *testing.T) {
		t.Parallel()
		p, err := policy.Parse([]byte("version: 1\ndomain: api\nunknown_domain: allow\nrules:\n  - {id: g, rate: 1, burst: 1}\n"), "d.yaml")
		require.NoError(t, err)
		assert.Equal(t, "api", p.Domain)
		assert.Equal(t, policy.DomainAllow, p.UnknownDomain)
		_, err = policy.Parse([]byte("version: 1\nunknown_domain: maybe\nrules:\n  - {id: g, rate: 1, burst: 1}\n"), "d.yaml")
		assert.ErrorContains(t, err, `d.yaml:2:17: unknown_domain "maybe": want reject or allow`)
	})
}

// TestDeniedRequestKeepsNoHybridCharge is issue 23's fifth item: a request denied by a later rule
// kept the charge of the hybrid rules that admitted it before; they now give it back.
func TestDeniedRequestKeepsNoHybridCharge(t *testing.T) {
	t.Parallel()
	t.Run("denied by a broader hybrid rule", func(t *testing.T) {
		t.Parallel()
		p := &policy.Policy{Rules: []policy.Rule{
			{ID: "per-tenant", Dimensions: []string{"tenant"}, Rate: 0.001, Burst: 1},
			{ID: "per-key", Dimensions: []string{"api_key", "tenant"}, Rate: 0.001, Burst: 2}, // narrower: first
		}}
		e := newEnv(t, []policy.Option{policy.WithMaxMemo(-1)}, p)
		r := func(tenant string) bool {
			return e.check(t, req("GET", "/", "api_key", "k1", "tenant", tenant)).Allowed
		}
		assert.True(t, r("t1"), "per-key 2→1, t1 1→0")
		for i := 0; i < 5; i++ {
			res := e.check(t, req("GET", "/", "api_key", "k1", "tenant", "t1"))
			require.False(t, res.Allowed)
			require.Equal(t, "per-tenant", res.Rule, "retry %d", i)
		}
		// per-key of (k1, t1) gave back each retry's charge: one token is left of its burst of 2.
		r2 := e.check(t, req("GET", "/", "api_key", "k1", "tenant", "t1"))
		require.NotEmpty(t, r2.Decisions)
		assert.Equal(t, "per-key:allow:local", units(r2)[0], "without refunds the five retries would have spent it")
		assert.Zero(t, e.enf.Stats().Unrefunded)
	})
	t.Run("denied by a strict rule", func(t *testing.T) {
		t.Parallel()
		p := &policy.Policy{Rules: []policy.Rule{
			{ID: "per-key", Dimensions: []string{"api_key"}, Rate: 0.001, Burst: 3},
			{ID: "tenant", Algorithm: policy.GCRA, Dimensions: []string{"tenant"}, Limit: 1, Period: time.Hour},
		}}
		e := newEnv(t, []policy.Option{policy.WithMaxMemo(-1)}, p)
		assert.True(t, e.check(t, req("GET", "/", "api_key", "k1", "tenant", "a")).Allowed)
		for i := 0; i < 5; i++ {
			res := e.check(t, req("GET", "/", "api_key", "k1", "tenant", "a"))
			require.False(t, res.Allowed)
			require.Equal(t, "tenant", res.Rule)
		}
		// Five denied requests left per-key with 2 of its 3 tokens: two more tenants get in, the
		// third is denied by per-key.
		assert.True(t, e.check(t, req("GET", "/", "api_key", "k1", "tenant", "b")).Allowed)
		assert.True(t, e.check(t, req("GET", "/", "api_key", "k1", "tenant", "c")).Allowed)
		res := e.check(t, req("GET", "/", "api_key", "k1", "tenant", "d"))
		assert.False(t, res.Allowed)
		assert.Equal(t, "per-key", res.Rule)
		assert.Zero(t, e.enf.Stats().Unrefunded)
	})
}

// TestReloadKeepsEachSubjectsConsumption is issue 23's second defect: the rate and burst were part
// of a hybrid bucket's Redis key, so a subject denied under burst 3 got 4 fresh admissions after a
// reload raised the burst to 4 (rate 1/s → 0.1/s). The bucket is now the subject's whatever its
// limit: its tokens are clamped to the new burst and refill at the new rate, and the subject stays
// denied. Strict rules keep their state too (their keys never held the limit).
func TestReloadKeepsEachSubjectsConsumption(t *testing.T) {
	t.Parallel()
	hybridRule := func(rate float64, burst int64) *policy.Policy {
		return &policy.Policy{Rules: []policy.Rule{{ID: "per-key", Dimensions: []string{"api_key"}, Rate: rate, Burst: burst}}}
	}
	for name, opts := range map[string][]hybrid.Option{
		"exact (every decision in Redis)": nil,
		"leases (library defaults)":       {hybrid.WithCheckTimeout(time.Second)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, []policy.Option{policy.WithMaxMemo(-1), policy.WithHybridOptions(opts...)}, hybridRule(1, 3))
			allowed := func(n int) (got int) {
				for i := 0; i < n; i++ {
					if e.check(t, req("GET", "/", "api_key", "k1")).Allowed {
						got++
					}
				}
				return got
			}
			require.Equal(t, 3, allowed(5), "burst 3")
			require.NoError(t, e.enf.SetPolicy(hybridRule(0.1, 4)))
			assert.Zero(t, allowed(5), "burst 3 → 4: the subject's consumption is kept, not reset")
			res := e.check(t, req("GET", "/", "api_key", "k1"))
			require.NotEmpty(t, res.Decisions)
			assert.Equal(t, int64(4), res.Decisions[0].Limit, "the new limit is in force")
			if l := e.enf.Limiter(); l != nil {
				require.NoError(t, l.Flush(context.Background()))
			}
			assert.Equal(t, int64(3), e.consumed(t, "per-key:api_key=k1"), "one bucket, counted once")
		})
	}
	t.Run("strict", func(t *testing.T) {
		t.Parallel()
		gcra := func(limit int64) *policy.Policy {
			return &policy.Policy{Rules: []policy.Rule{{ID: "per-key", Algorithm: policy.GCRA, Dimensions: []string{"api_key"}, Limit: limit, Period: time.Hour}}}
		}
		e := newEnv(t, []policy.Option{policy.WithMaxMemo(-1)}, gcra(3))
		for i := 0; i < 3; i++ {
			require.True(t, e.check(t, req("GET", "/", "api_key", "k1")).Allowed)
		}
		require.NoError(t, e.enf.SetPolicy(gcra(4)))
		assert.False(t, e.check(t, req("GET", "/", "api_key", "k1")).Allowed, "limit 3 → 4 per hour: consumption kept")
	})
}
