package concurrency_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// BenchmarkAcquireRelease measures one TryAcquire and one Release, two round trips to a real
// redis-server on loopback, across key counts (keys: 1 is every caller on one key).
func BenchmarkAcquireRelease(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b, func(o *redis.Options) { o.PoolSize = 64 })
	lim, err := concurrency.New(rdb, concurrency.WithTimeout(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer lim.Close(context.Background())
	for _, nkeys := range []int{1, 1000} {
		keys := make([]string, nkeys)
		for i := range keys {
			keys[i] = "tenant-" + strconv.Itoa(i)
		}
		b.Run("keys="+strconv.Itoa(nkeys), func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					ls, err := lim.TryAcquire(ctx, keys[i%nkeys], concurrency.MaxLimit, time.Minute)
					if err != nil || !ls.Acquired() || ls.Source() != outcome.SourceCentral {
						b.Errorf("acquire: %v %v", err, ls)
						return
					}
					if err := ls.Release(ctx); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
		})
	}
}
