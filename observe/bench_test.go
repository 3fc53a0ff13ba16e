package observe_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/metrictest"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/observe"
	"github.com/hybridrate/hybridrate/policy"
)

// BenchmarkCheck compares a policy check on the local path with and without an Observer (OTel SDK
// with a manual reader, the window, labels): the Observer's cost per check.
func BenchmarkCheck(b *testing.B) {
	_, rdb := redistest.Mini(b)
	mp := metrictest.New(b).Provider
	enf, err := policy.NewEnforcer(rdb, policy.WithHybridOptions(hybrid.WithCheckTimeout(time.Second)))
	require.NoError(b, err)
	b.Cleanup(func() { _ = enf.Close(context.Background()) })
	obs, err := observe.New(enf, observe.WithMeterProvider(mp))
	require.NoError(b, err)
	b.Cleanup(func() { _ = obs.Close() })
	require.NoError(b, obs.SetPolicy(&policy.Policy{Rules: []policy.Rule{
		{ID: "per-key", Dimensions: []string{"api_key"}, Rate: 1e6, Burst: 1e6}}}))
	reqs := make([]*policy.Request, 1000)
	for i := range reqs {
		reqs[i] = &policy.Request{Method: "GET", Decisions: make([]policy.Decision, 0, 4),
			Dims: policy.Values{"api_key": "key-" + strconv.Itoa(i), "route": "GET /v1/items/{id}"}}
	}
	for name, c := range map[string]policy.Checker{"enforcer": enf, "observer": obs} {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			for _, r := range reqs { // every key local
				for i := 0; i < 3; i++ {
					_, _ = c.Check(ctx, r)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.Check(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
