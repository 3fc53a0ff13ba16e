package bench

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// BenchmarkRedisBytesPerBucket reports what Redis holds per key (metric B/key: MEMORY USAGE of the
// key, name included, averaged over 1,000 keys): impl=lua-bucket, a strict central Lua token bucket's
// hash (loadgen's "central" peer: fields t and u), after one take per key; impl=hybrid/nodes=N, a
// hybrid bucket ("<prefix>:v6:b:{key}") that N limiters (each its own node id) decided on, every
// limiter making one decision per key and then a Flush, so that each node's record is written. The
// limit is 100/s with a burst of 100 for both. Run it with -benchtime 1x:
//
//	go test ./bench -run '^$' -bench RedisBytesPerBucket -benchtime 1x
func BenchmarkRedisBytesPerBucket(b *testing.B) {
	_, rdb := startRedis(b)
	ctx := context.Background()
	const n = 1000
	keys := names(n)
	limit := hybrid.PerSecond(100)
	usage := func(b *testing.B, names []string) float64 { return redistest.MeanMemoryUsage(b, ctx, rdb, names) }
	b.Run("impl=lua-bucket", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			rkeys := make([]string, n)
			for j, k := range keys {
				rkeys[j] = "bench" + strconv.Itoa(i) + ":lua:{" + k + "}"
				if err := strictScript.Run(ctx, rdb, rkeys[j:j+1], "100", 100, 1).Err(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(usage(b, rkeys), "B/key")
			b.ReportMetric(0, "ns/op")
		}
	})
	for _, nodes := range []int{1, 2, 8} {
		b.Run("impl=hybrid/nodes="+strconv.Itoa(nodes), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				prefix := "bytes" + strconv.Itoa(nodes) + "x" + strconv.Itoa(i)
				for range nodes {
					lim := newLimiter(b, rdb, hybrid.WithKeyPrefix(prefix), hybrid.WithSyncInterval(time.Minute),
						hybrid.WithCheckTimeout(time.Second))
					for _, k := range keys {
						if _, err := lim.Allow(ctx, k, limit); err != nil {
							b.Fatal(err)
						}
					}
					if err := lim.Flush(ctx); err != nil {
						b.Fatal(err)
					}
				}
				rkeys := make([]string, n)
				for j, k := range keys {
					rkeys[j] = central.BucketKey(prefix, k)
				}
				b.ReportMetric(usage(b, rkeys), "B/key")
				b.ReportMetric(0, "ns/op")
			}
		})
	}
}
