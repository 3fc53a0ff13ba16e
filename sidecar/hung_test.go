package sidecar_test

import (
	"context"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/policy/policytest"
	"github.com/hybridrate/hybridrate/sidecar"
)

const hungPolicy = `
version: 1
rules:
  - id: per-tenant
    algorithm: gcra
    dimensions: [tenant]
    limit: 1000
    period: 1s
    on_failure: fail_open
  - id: per-user
    dimensions: [user]
    rate: 1000
    burst: 1000
    on_failure: fail_open
`

// TestHungRedisBounded (issue 26): on a redis-server stopped with SIGSTOP (it accepts connections
// and answers nothing), with a client created with go-redis's defaults (ContextTimeoutEnabled false,
// ReadTimeout 3s), the sidecar answers each request within a few times the strict timeout, never
// the client's ReadTimeout, and decides in Redis again after SIGCONT.
func TestHungRedisBounded(t *testing.T) {
	t.Parallel()
	srv, enf := policytest.HungEnforcer(t)
	const timeout = policytest.HungTimeout
	policytest.SetPolicy(t, enf, hungPolicy, "hung.yaml")
	side, err := sidecar.New(enf)
	require.NoError(t, err)
	ctx := context.Background()
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "t1"}, {Key: "user", Value: "u1"}}},
	}}
	resp, err := side.ShouldRateLimit(ctx, req)
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode)

	srv.Hung(t, "ShouldRateLimit", 6, 4*timeout, func(int) { // 6: through the strict breaker's opening and beyond
		resp, err := side.ShouldRateLimit(ctx, req)
		require.NoError(t, err)
		assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode, "fail open")
	})
	require.Eventually(t, func() bool {
		resp, err := side.ShouldRateLimit(ctx, req)
		return err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OK && enf.StrictHealth().Breaker == "closed"
	}, 10*time.Second, 20*time.Millisecond, "Redis decides again after SIGCONT")
}
