package bench

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/local"
)

// BenchmarkBytesPerKey reports the heap each implementation holds per key (metric B/key) once it
// tracks 1,048,576 keys, key strings excluded (they are built before and held throughout): hybrid
// (its local store, with the sync interval at a minute so no reconcile runs while it fills; every key
// takes its first tokens from the cold-start credit, without Redis), hybrid-synced (the same, then
// one Flush: every key reconciled once with Redis and its answer applied, and the syncer watching
// the keys that hold a lease: what a key costs once it is in use), local.Store alone (an entry and
// its table slot), a map of x/time/rate limiters and a sync.Map of them. Each figure is the live
// heap after two GCs, less the heap before the implementation was built. Run it with -benchtime 1x:
//
//	go test ./bench -run '^$' -bench BytesPerKey -benchtime 1x -count 3
func BenchmarkBytesPerKey(b *testing.B) {
	const n = largeKeys
	keys := names(n)
	measure := func(b *testing.B, fill func() any) {
		before := heap()
		kept := fill()
		after := heap()
		runtime.KeepAlive(kept)
		b.ReportMetric(float64(after-before)/n, "B/key")
		b.ReportMetric(0, "ns/op")
	}
	b.Run("impl=hybrid", func(b *testing.B) {
		_, rdb := startRedis(b)
		for i := 0; i < b.N; i++ {
			measure(b, func() any {
				lim := newLimiter(b, rdb, hybrid.WithSyncInterval(time.Minute), hybrid.WithMaxKeys(2*n),
					hybrid.WithCheckTimeout(time.Second))
				ctx := context.Background()
				for _, k := range keys {
					if _, err := lim.Allow(ctx, k, generous); err != nil {
						b.Fatal(err)
					}
				}
				if got := lim.Stats().Keys; got != n {
					b.Fatalf("hybrid holds %d keys, want %d", got, n)
				}
				return lim
			})
		}
	})
	b.Run("impl=hybrid-synced", func(b *testing.B) {
		_, rdb := startRedis(b)
		for i := 0; i < b.N; i++ {
			measure(b, func() any {
				lim := newLimiter(b, rdb, hybrid.WithSyncInterval(time.Minute), hybrid.WithMaxKeys(2*n),
					hybrid.WithCheckTimeout(time.Second), hybrid.WithFlushTimeout(time.Minute),
					hybrid.WithKeyPrefix("synced"+strconv.Itoa(i)))
				ctx := context.Background()
				for _, k := range keys {
					if _, err := lim.Allow(ctx, k, generous); err != nil {
						b.Fatal(err)
					}
				}
				// A round that timed out on a loaded machine leaves its keys pending: flush again.
				for try := 0; ; try++ {
					err := lim.Flush(ctx)
					if err == nil && lim.Stats().Pending == 0 {
						break
					}
					if try == 4 {
						b.Fatalf("five flushes left %d keys pending: %v", lim.Stats().Pending, err)
					}
				}
				if st := lim.Stats(); st.Keys != n || st.Pending != 0 {
					b.Fatalf("hybrid holds %d keys, %d pending; want %d, 0", st.Keys, st.Pending, n)
				}
				return lim
			})
		}
	})
	b.Run("impl=local-store", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			measure(b, func() any {
				s, err := local.New(local.Config{MaxKeys: 2 * n})
				if err != nil {
					b.Fatal(err)
				}
				for _, k := range keys {
					s.Insert(k, s.Hash(k), generous.Rate, generous.Burst, 2)
				}
				return s
			})
		}
	})
	b.Run("impl=xrate-map", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			measure(b, func() any {
				m := newXRateMap(rate.Limit(generous.Rate), int(generous.Burst))
				for _, k := range keys {
					m.allow(k)
				}
				return m
			})
		}
	})
	b.Run("impl=xrate-syncmap", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			measure(b, func() any {
				m := &xrateSyncMap{limit: rate.Limit(generous.Rate), burst: int(generous.Burst)}
				for _, k := range keys {
					m.allow(k)
				}
				return m
			})
		}
	})
}

// heap returns the live heap after two garbage collections.
func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// xrateSyncMap is a sync.Map of x/time/rate limiters, the other way users write a keyed limiter.
type xrateSyncMap struct {
	m     sync.Map
	limit rate.Limit
	burst int
}

func (x *xrateSyncMap) allow(key string) bool {
	v, ok := x.m.Load(key)
	if !ok {
		v, _ = x.m.LoadOrStore(key, rate.NewLimiter(x.limit, x.burst))
	}
	return v.(*rate.Limiter).Allow()
}
