package bench

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/redisx"
)

// BenchmarkOneOffTakeRedisCPU compares what Redis spends on a one-off take (take.lua through
// central.Client.Take: a node's decision on a fleet larger than the key's burst, issue 21) with a
// strict central bucket's decision (loadgen's central mode), serially, on 300 keys of 50/s and
// burst 60 taken round-robin (each key every 300 calls, so both admit nearly all). The two run in
// alternating chunks of chunk calls inside each benchmark iteration, so that both see the same
// machine; the figures are the whole server's CPU (INFO cpu, user + sys) per call, and Redis's own
// time in the script (EVALSHA usec of INFO commandstats). Run with -benchtime=Nx and -count.
func BenchmarkOneOffTakeRedisCPU(b *testing.B) {
	_, rdb := startRedis(b)
	ctx := context.Background()
	const nkeys, chunk = 300, 2000
	keys := names(nkeys)
	c, err := central.New(central.Config{
		Client: rdb, Prefix: "take", NodeID: "node0",
		SyncTimeout: time.Second, FlushTimeout: 10 * time.Second, MaxBatch: 1,
		PruneAge: 10 * time.Minute, Recount: time.Minute, ActiveWindow: 16 * time.Second,
		Horizon: 4 * time.Second, Advance: time.Second, Fleet: func() int64 { return 512 },
		Breaker: redisx.BreakerConfig{Threshold: 5, Cooldown: 500 * time.Millisecond},
	})
	if err != nil {
		b.Fatal(err)
	}
	rkeys := make([][]string, nkeys)
	for i, k := range keys {
		rkeys[i] = []string{"central:{" + k + "}"}
	}
	lim := central.Limit{Rate: 50, Burst: 60}
	take := func(i int) {
		st, err := c.Take(ctx, central.Update{Key: keys[i%nkeys], Limit: lim, Want: 1, N: 1})
		if err != nil || st.Status != central.StatusCovered {
			b.Fatalf("take: %v, status %v", err, st.Status)
		}
	}
	bucket := func(i int) {
		v, err := strictScript.Run(ctx, rdb, rkeys[i%nkeys], strconv.FormatFloat(lim.Rate, 'g', -1, 64), lim.Burst, 1).Slice()
		if err != nil || v[0].(int64) != 1 {
			b.Fatalf("central bucket: %v %v", err, v)
		}
	}
	for i := range nkeys { // create the buckets and load the scripts outside the timer
		take(i)
		bucket(i)
	}
	var cpu, usec [2]float64
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		for side, f := range []func(int){take, bucket} {
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			cpu0 := serverCPU(b, rdb)
			for i := range chunk {
				f(n*chunk + i)
			}
			cpu[side] += (serverCPU(b, rdb) - cpu0).Seconds() * 1e6
			calls, us := evalshaStats(b, rdb)
			if calls != chunk {
				b.Fatalf("%d EVALSHA calls, want %d", calls, chunk)
			}
			usec[side] += float64(us)
		}
	}
	b.StopTimer()
	calls := float64(b.N * chunk)
	b.ReportMetric(cpu[0]/calls, "take-server-µs/call")
	b.ReportMetric(cpu[1]/calls, "bucket-server-µs/call")
	b.ReportMetric(cpu[0]/cpu[1], "take÷bucket")
	b.ReportMetric(usec[0]/calls, "take-redis-µs/call")
	b.ReportMetric(usec[1]/calls, "bucket-redis-µs/call")
}
