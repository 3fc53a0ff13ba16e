package sidecar_test

import (
	"context"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/sidecar"
)

// newRealServer returns a Server enforcing the YAML policy on a fresh redis-server, with hybrid rules
// decided in Redis at every request (drift 0) so that counts are exact.
func newRealServer(t *testing.T, yaml string) *sidecar.Server {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	enf, err := policy.NewEnforcer(policy.Config{Redis: rdb, StrictTimeout: time.Second,
		HybridOptions: []hybrid.Option{hybrid.WithDriftThreshold(0), hybrid.WithCheckTimeout(time.Second)},
		Dimensions:    []string{"domain"},
		CostFuncs:     map[string]policy.CostFunc{sidecar.HitsCostName: sidecar.HitsCost}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = enf.Close(context.Background()) })
	p, err := policy.Parse([]byte(yaml), "policy.yaml")
	require.NoError(t, err)
	require.NoError(t, enf.SetPolicy(p))
	s, err := sidecar.New(sidecar.Config{Checker: enf, Instance: "t"})
	require.NoError(t, err)
	return s
}

func code(t *testing.T, s *sidecar.Server, req *rlsv3.RateLimitRequest) rlsv3.RateLimitResponse_Code {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), req)
	require.NoError(t, err)
	return resp.OverallCode
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// TestDomainsAreNamespaces: a key denied in domain "api" was also denied (and counted) in
// "totally-other-service" (issue 23).
func TestDomainsAreNamespaces(t *testing.T) {
	t.Parallel()
	s := newRealServer(t, `
version: 1
missing_key: skip
rules:
  - {id: per-key, dimensions: [api_key], limit: 2, period: 1h}
  - {id: strict-key, algorithm: gcra, dimensions: [api_key], limit: 3, period: 1h}
`)
	in := func(domain string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{desc("api_key", "k1")}}
	}
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, over},
		[]rlsv3.RateLimitResponse_Code{code(t, s, in("api")), code(t, s, in("api")), code(t, s, in("api"))})
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, over},
		[]rlsv3.RateLimitResponse_Code{code(t, s, in("totally-other-service")), code(t, s, in("totally-other-service")),
			code(t, s, in("totally-other-service"))}, "another domain has its own counters")
}

// TestHitsAddendIsChargedByDefault: hits_addend was charged as 1 unless a rule named the
// hits_addend cost function; 15 then 15 under a burst of 20 were both admitted (issue 23).
func TestHitsAddendIsChargedByDefault(t *testing.T) {
	t.Parallel()
	s := newRealServer(t, `
version: 1
missing_key: skip
rules:
  - {id: per-key, dimensions: [api_key], rate: 0.001, burst: 20}
  - {id: per-tenant, algorithm: gcra, dimensions: [tenant], limit: 20, period: 1h}
  - {id: fixed, dimensions: [user], rate: 0.001, burst: 20, cost: 10}
`)
	hits := func(key string, n uint32) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: n, Descriptors: []*rlv3.RateLimitDescriptor{desc(key, "k1")}}
	}
	for _, key := range []string{"api_key", "tenant"} {
		assert.Equal(t, ok, code(t, s, hits(key, 15)), key)
		assert.Equal(t, over, code(t, s, hits(key, 15)), "%s: 15+15 > 20", key)
		assert.Equal(t, ok, code(t, s, hits(key, 5)), "%s: 15+5 fits", key)
		assert.Equal(t, over, code(t, s, hits(key, 0)), "%s: an unset hits_addend is 1", key)
	}
	// A rule with a cost of its own keeps it.
	assert.Equal(t, ok, code(t, s, hits("user", 1)))
	assert.Equal(t, ok, code(t, s, hits("user", 1)))
	assert.Equal(t, over, code(t, s, hits("user", 1)), "10+10+10 > 20")

	// A descriptor's hits_addend of 0 checks without charging.
	check := func(key, v string) *rlsv3.RateLimitRequest {
		d := desc(key, v)
		d.HitsAddend = wrapperspb.UInt64(0)
		return &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 7, Descriptors: []*rlv3.RateLimitDescriptor{d}}
	}
	assert.Equal(t, over, code(t, s, check("api_key", "k1")), "k1 has no token left")
	for i := 0; i < 30; i++ {
		require.Equal(t, ok, code(t, s, check("api_key", "k2")), "check %d charges nothing", i)
	}
	full := &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 20, Descriptors: []*rlv3.RateLimitDescriptor{desc("api_key", "k2")}}
	assert.Equal(t, ok, code(t, s, full), "k2 is still full: 20 fit")
}
