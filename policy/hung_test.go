package policy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/policy/policytest"
)

// TestHungRedisBounded (issue 26): on a redis-server stopped with SIGSTOP (it accepts connections
// and answers nothing), with a client created with go-redis's defaults (ContextTimeoutEnabled false,
// ReadTimeout 3s), Check with a strict and a hybrid rule returns within a few times StrictTimeout
// (the strict call) plus the hybrid check timeout, never the client's ReadTimeout; after SIGCONT the
// strict rule is decided in Redis again.
func TestHungRedisBounded(t *testing.T) {
	t.Parallel()
	srv, enf := policytest.HungEnforcer(t)
	const timeout = policytest.HungTimeout
	setHungPolicy(t, enf)
	ctx := context.Background()

	srv.Hung(t, "Check", 6, 4*timeout, func(int) { // 6: through the strict breaker's opening and beyond
		res, err := enf.Check(ctx, &policy.Request{})
		require.NoError(t, err)
		assert.True(t, res.Allowed, "fail open")
	})
	require.Eventually(t, func() bool {
		_, err := enf.Check(ctx, &policy.Request{})
		return err == nil && enf.StrictHealth().Breaker == "closed"
	}, 10*time.Second, 20*time.Millisecond, "strict rules reach Redis again after SIGCONT")
}

// TestHungClusterBounded: TestHungRedisBounded on a Redis Cluster with every master stopped with
// SIGSTOP, for cluster clients with go-redis's defaults (ContextTimeoutEnabled false, ReadTimeout
// 5s), with no read timeout at all, and with ContextTimeoutEnabled: every Check returns within 10
// times StrictTimeout (it took the client's 5s ReadTimeout, or forever, before the strict and hybrid
// limiters used a cluster client of their own), and Close leaves the caller's client open.
func TestHungClusterBounded(t *testing.T) {
	redistest.ForEachClusterSetup(t, func(t *testing.T, run redistest.ClusterRun) {
		cl, rdb, name := run.Cluster, run.Client, run.Name
		const timeout = 50 * time.Millisecond
		enf, err := policy.NewEnforcer(
			rdb,
			policy.WithStrictTimeout(timeout),
			policy.WithKeyPrefix("hung"+string(rune('a'+len(name)))),
		)
		require.NoError(t, err)
		setHungPolicy(t, enf)
		ctx := context.Background()

		masters := cl.Nodes() // 3 masters, no replicas
		for _, m := range masters {
			m.Pause(t)
		}
		const bound = 10 * timeout // a tenth of the 5s ReadTimeout; room for a loaded machine and -race
		for i := range 6 {         // through the strict breaker's opening and beyond
			redistest.Timed(t, fmt.Sprintf("Check %d on a hung cluster", i), bound, func() {
				res, err := enf.Check(ctx, &policy.Request{})
				require.NoError(t, err)
				assert.True(t, res.Allowed, "fail open")
			})
		}
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_ = enf.Close(cctx) // the hybrid limiter's final flush fails: the cluster is still hung
		cancel()
		t.Logf("Close on a hung cluster: %v", time.Since(start))
		// Within its context, after the hybrid limiter's background calls in flight end (each within
		// the flush timeout, 500ms).
		assert.Less(t, time.Since(start), time.Second+hybrid.DefaultFlushTimeout+250*time.Millisecond, "Close on a hung cluster")

		for _, m := range masters {
			m.Resume(t)
		}
		cl.WaitHealthy(t, 30*time.Second)
		require.NoError(t, rdb.Ping(ctx).Err(), "the caller's client is not closed")
	})
}

// setHungPolicy gives enf a hybrid and a strict rule, both failing open, and requires a first
// Check, with Redis up, to be allowed.
func setHungPolicy(t *testing.T, enf *policy.Enforcer) {
	t.Helper()
	require.NoError(t, enf.SetPolicy(&policy.Policy{Rules: []policy.Rule{
		{ID: "h", Rate: 1000, Burst: 1000, OnFailure: outcome.FailOpen},
		{ID: "s", Algorithm: policy.GCRA, Rate: 1000, Burst: 1000, OnFailure: outcome.FailOpen},
	}}))
	res, err := enf.Check(context.Background(), &policy.Request{})
	require.NoError(t, err)
	require.True(t, res.Allowed)
}
