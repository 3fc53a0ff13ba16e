package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/strictbucket"
	"github.com/hybridrate/hybridrate/outcome"
)

// strictScript is cmd/loadgen's strict central token bucket (the "central" mode).
var strictScript = redis.NewScript(strictbucket.Source())

// BenchmarkCentral measures limiters that make one Redis round trip per decision, on 1k keys: a
// strict Lua token bucket (EVALSHA), go-redis/redis_rate (GCRA, EVALSHA) and hybrid with a drift
// threshold of 0, which sends every decision to Redis (with a 1s sync timeout, so that a slow
// moment on a busy machine does not turn into failure-policy decisions, which would be measured
// instead; a failure-policy decision fails the benchmark). Serial runs show the round trip; parallel
// runs (64 goroutines on the pool) show what one Redis serves.
//
// With drift 0 and concurrent decisions on one key, a few decisions are still local: a take's
// answer can grant an allowance that covers another goroutine's take still in flight. The share is
// reported as local-share.
func BenchmarkCentral(b *testing.B) {
	_, rdb := startRedis(b)
	ctx := context.Background()
	keys := names(smallKeys)
	seq := uniformSeq(smallKeys)

	b.Run("impl=lua-bucket", func(b *testing.B) {
		rkeys := make([][]string, len(keys))
		for i, k := range keys {
			rkeys[i] = []string{"bench:lua:{" + k + "}"}
		}
		benchRemote(b, seq, func(k int32) (bool, error) {
			v, err := strictScript.Run(ctx, rdb, rkeys[k], "1e9", 1_000_000_000, 1).Slice()
			if err != nil {
				return false, err
			}
			n, _ := v[0].(int64)
			return n == 1, nil
		})
	})
	b.Run("impl=redis_rate", func(b *testing.B) {
		rl := redis_rate.NewLimiter(rdb)
		limit := redis_rate.Limit{Rate: 1_000_000_000, Burst: 1_000_000_000, Period: 1e9}
		rkeys := make([]string, len(keys))
		for i, k := range keys {
			rkeys[i] = "bench:" + k
		}
		benchRemote(b, seq, func(k int32) (bool, error) {
			r, err := rl.Allow(ctx, rkeys[k], limit)
			if err != nil {
				return false, err
			}
			return r.Allowed == 1, nil
		})
	})
	b.Run("impl=hybrid-drift0", func(b *testing.B) {
		lim := newLimiter(b, rdb, hybrid.WithDriftThreshold(0), hybrid.WithKeyPrefix("benchd0"), hybrid.WithCheckTimeout(time.Second))
		var local, all atomic.Int64
		benchRemote(b, seq, func(k int32) (bool, error) {
			d, err := lim.Decide(ctx, keys[k], generous)
			all.Add(1)
			switch {
			case err != nil:
			case d.Source == outcome.SourceLocal:
				local.Add(1)
			case d.Source != outcome.SourceCentral:
				return false, fmt.Errorf("decided by %v, not by Redis", d.Source)
			}
			return d.Allowed, err
		}, func(b *testing.B) {
			b.ReportMetric(float64(local.Swap(0))/float64(max(all.Swap(0), 1)), "local-share")
		})
	})
}

// benchRemote runs decide serially and from 64 goroutines (b.SetParallelism(32) on 2 CPUs); it
// fails b on an error or a denial. report, if given, runs after each timed loop.
func benchRemote(b *testing.B, seq []int32, decide func(int32) (bool, error), report ...func(*testing.B)) {
	mask := len(seq) - 1
	for i := range 64 { // load the script and fill the pool outside the timer
		if _, err := decide(seq[i]); err != nil {
			b.Fatal(err)
		}
	}
	for _, r := range report {
		r(b) // reset
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			ok, err := decide(seq[i&mask])
			if err != nil || !ok {
				b.Fatalf("decision %d: allowed %v, err %v", i, ok, err)
			}
		}
		b.StopTimer()
		for _, r := range report {
			r(b)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var offset atomic.Int64
		b.SetParallelism(32)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := int(offset.Add(1) * 104_729)
			for pb.Next() {
				ok, err := decide(seq[i&mask])
				if err != nil || !ok {
					b.Errorf("allowed %v, err %v", ok, err)
					return
				}
				i++
			}
		})
		b.StopTimer()
		for _, r := range report {
			r(b)
		}
	})
}
