package policy_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
)

// TestLocalDecisionsKeepEachKeyApart checks Check's borrowed counter keys (built in a pooled buffer
// that the next request reuses, and handed only to hybrid's fast path): once every subject is
// decided locally, subjects checked in turn, each a different number of times, are each charged
// exactly their own requests, in the local store and then in Redis. A key kept by the limiter over
// a reused buffer would change under it and merge or lose some subjects' counts.
func TestLocalDecisionsKeepEachKeyApart(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{Rules: []policy.Rule{
		{ID: "per-key", Dimensions: []string{"api_key"}, Rate: 1e6, Burst: 1e6},
		{ID: "per-key-tiered", Dimensions: []string{"api_key", "tenant"}, Rate: 1e6, Burst: 1e6},
	}}
	e := newEnv(t, []policy.Option{policy.WithHybridOptions(hybrid.WithSyncInterval(5*time.Millisecond),
		hybrid.WithCheckTimeout(time.Second))}, p)
	const subjects = 200
	reqs := make([]*policy.Request, subjects)
	for i := range reqs {
		reqs[i] = req("GET", "GET /", "api_key", "k"+strconv.Itoa(i), "tenant", "t"+strconv.Itoa(i%3))
	}
	warm := make([]int64, subjects) // requests each subject made while warming up
	for deadline := time.Now().Add(20 * time.Second); ; {
		local := true
		for i, r := range reqs {
			res := e.check(t, r)
			require.True(t, res.Allowed)
			warm[i]++
			for _, d := range res.Decisions {
				local = local && d.Source == outcome.SourceLocal
			}
		}
		if local {
			break
		}
		require.False(t, time.Now().After(deadline), "decisions did not become local")
		time.Sleep(10 * time.Millisecond) // let a reconcile hand out allowances
	}
	for round := 0; round < 7; round++ {
		for i, r := range reqs {
			if round < i%7+1 {
				res := e.check(t, r)
				require.True(t, res.Allowed)
			}
		}
	}
	require.NoError(t, e.enf.Close(context.Background())) // flushes every local charge to Redis
	for i := range reqs {
		want := warm[i] + int64(i%7+1)
		require.Equal(t, want, e.consumed(t, "per-key:api_key=k"+strconv.Itoa(i)), "subject %d", i)
		require.Equal(t, want, e.consumed(t, "per-key-tiered:api_key=k"+strconv.Itoa(i)+",tenant=t"+strconv.Itoa(i%3)), "subject %d", i)
	}
}
