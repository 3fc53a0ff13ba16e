package policy_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
)

// BenchmarkCheck measures Enforcer.Check on admitted requests of hybrid rules far from their limits
// (decisions local), over 1000 API keys.
//
//	go test -run '^$' -bench BenchmarkCheck -benchmem ./policy/
func BenchmarkCheck(b *testing.B) {
	generous := policy.Rule{ID: "per-key", Dimensions: []string{"api_key"}, Rate: 1e9, Burst: 1e9}
	for _, tc := range []struct {
		name  string
		opts  []policy.Option
		rules []policy.Rule
	}{
		{"1-rule", nil, []policy.Rule{generous}},
		{"1-rule-hashed", []policy.Option{policy.WithHashKey([]byte("0123456789abcdef0123456789abcdef"))}, []policy.Rule{generous}},
		{"3-rules", nil, []policy.Rule{{ID: "global", Rate: 1e9, Burst: 1e9}, generous,
			{ID: "per-ip-route", Dimensions: []string{"ip", "route"}, Rate: 1e9, Burst: 1e9}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv := redistest.Start(b)
			rdb := srv.Client(b, redistest.NoRetries)
			opts := append([]policy.Option{policy.WithHybridOptions(hybrid.WithCheckTimeout(time.Second))}, tc.opts...)
			enf, err := policy.NewEnforcer(rdb, opts...)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = enf.Close(context.Background()) })
			if err := enf.SetPolicy(&policy.Policy{Rules: tc.rules}); err != nil {
				b.Fatal(err)
			}
			reqs := make([]*policy.Request, 1000)
			for i := range reqs {
				reqs[i] = &policy.Request{Method: "GET", Dims: policy.Values{"api_key": "key-" + strconv.Itoa(i), "ip": "192.0.2.1", "route": "GET /items/{id}"}}
			}
			ctx := context.Background()
			deadline := time.Now().Add(10 * time.Second)
			for local := false; !local; {
				local = true
				for _, r := range reqs {
					res, err := enf.Check(ctx, r)
					if err != nil {
						b.Fatal(err)
					}
					for _, d := range res.Decisions {
						local = local && d.Source == outcome.SourceLocal
					}
				}
				if time.Now().After(deadline) {
					b.Fatal("decisions did not become local within 10s")
				}
				time.Sleep(5 * time.Millisecond)
			}
			b.Run("serial", func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					_, _ = enf.Check(ctx, reqs[i%len(reqs)])
				}
			})
			b.Run("parallel", func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						_, _ = enf.Check(ctx, reqs[i%len(reqs)])
						i++
					}
				})
			})
		})
	}
}
