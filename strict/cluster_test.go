package strict

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
)

// TestStrictClusterFailover: after the master of a subject's slot dies and a replica takes over, the
// limiter answers again within seconds. Strict used not to ask go-redis to reload the slot map after
// a failed call, so it kept dialling the dead master until go-redis's periodic reload (a minute).
func TestStrictClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 6-node Redis Cluster and fails a master over; run without -short")
	}
	t.Parallel()
	t.Cleanup(func() { redistest.AwaitDialRetries(t) }) // registered first: runs after the clients are closed
	cl := redistest.StartCluster(t, 3, 1)
	cc := cl.Client(t, func(o *redis.ClusterOptions) { o.ContextTimeoutEnabled = true })
	l := newTestStrict(t, cc, WithTimeout(200*time.Millisecond))
	rule := Rule{Name: "r", Algorithm: GCRA, Limit: 1_000_000, Period: time.Second}
	const subject = "failover"
	ctx := context.Background()
	_, err := l.Allow(ctx, rule, subject)
	require.NoError(t, err)
	old := cl.MasterFor(t, key("t", subject, rule.Name, rule.Algorithm.code(), subject))

	killed := time.Now()
	old.Kill(t)
	// Calls while the cluster elects a new master: they fail, and each failure asks for a reload.
	for i := 0; i < 5; i++ {
		_, err := l.Allow(ctx, rule, subject)
		assert.Error(t, err, "the master is dead")
	}
	cl.WaitHealthy(t, 20*time.Second)
	healthy := time.Now()
	require.NotSame(t, old, cl.MasterFor(t, key("t", subject, rule.Name, rule.Algorithm.code(), subject)), "a replica took over")
	var lastErr error
	assert.Eventually(t, func() bool {
		_, lastErr = l.Decide(ctx, rule, subject)
		return lastErr == nil
	}, 10*time.Second, 20*time.Millisecond, "no successful call within 10s of the new master")
	require.NoError(t, lastErr, "the last call")
	t.Logf("master killed; new master serving after %v; strict answered again %v after that",
		healthy.Sub(killed).Round(time.Millisecond), time.Since(healthy).Round(time.Millisecond))
	for i := 0; i < 20; i++ {
		_, err := l.Allow(ctx, rule, subject)
		require.NoError(t, err, "once recovered, it stays recovered")
	}
}
