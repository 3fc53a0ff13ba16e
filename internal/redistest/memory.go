package redistest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// MeanMemoryUsage returns the mean of Redis's MEMORY USAGE (all samples) over keys, in bytes, from
// one pipeline; tb fails on an error. For the benchmarks that compare what a bucket costs in Redis.
func MeanMemoryUsage(tb testing.TB, ctx context.Context, rdb redis.UniversalClient, keys []string) float64 {
	tb.Helper()
	pipe := rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.MemoryUsage(ctx, k, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		tb.Fatal(err)
	}
	total := int64(0)
	for _, c := range cmds {
		total += c.Val()
	}
	return float64(total) / float64(max(len(keys), 1))
}
