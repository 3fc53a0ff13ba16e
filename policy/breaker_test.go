package policy_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/policy/policytest"
)

// TestStrictBreakerMinSpan: the strict rules' circuit breaker opens, like the hybrid limiter's, only
// when its run of failures lasts 50ms. Many calls that fail at one instant (a GC pause, a starved
// CPU) must not switch every strict rule to its failure policy for a whole cooldown. The breaker
// used to be built without the minimum span its comment promised.
func TestStrictBreakerMinSpan(t *testing.T) {
	t.Parallel()
	t.Cleanup(func() { redistest.AwaitDialRetries(t) }) // registered first: runs after the client is closed
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now: every call fails at once
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond,
		DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	var now atomic.Int64 // the Enforcer's clock, ns
	now.Store(time.Unix(1_000_000, 0).UnixNano())
	enf := policytest.NewEnforcer(t, rdb, policy.WithClock(func() time.Time { return time.Unix(0, now.Load()) }))
	require.NoError(t, enf.SetPolicy(&policy.Policy{Rules: []policy.Rule{
		{ID: "s", Algorithm: policy.GCRA, Rate: 10, Burst: 10, OnFailure: outcome.FailOpen},
	}}))
	check := func() {
		t.Helper()
		res, err := enf.Check(context.Background(), &policy.Request{})
		require.NoError(t, err)
		assert.True(t, res.Allowed, "fail open")
	}
	for range 20 {
		check()
	}
	h := enf.StrictHealth()
	assert.Equal(t, "closed", h.Breaker, "20 failures within one instant: a stall, not an outage")
	assert.Equal(t, int64(20), h.Errors)
	now.Add(int64(49 * time.Millisecond))
	check()
	assert.Equal(t, "closed", enf.StrictHealth().Breaker, "49ms of failures")
	now.Add(int64(time.Millisecond))
	check()
	assert.Equal(t, "open", enf.StrictHealth().Breaker, "50ms of failures: an outage")
}
