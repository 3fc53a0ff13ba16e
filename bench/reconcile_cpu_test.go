package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/redisx"
)

// BenchmarkReconcileRedisCPU measures Redis's own CPU in reconcile.lua: the usec of EVALSHA in INFO
// commandstats (it includes the commands the script runs), per script call and per key. One round is
// 8 nodes reconciling the same 200 keys, in script calls of keys-per-call keys; every key holds a
// bucket and 8 node records (a warm-up round creates them before the timer). n=0 is a background
// reconcile, n=1 a synchronous call. Each node consumes 2 tokens per key and round, declares a
// demand with a fraction and asks for a lease. The figures to read are redis-µs/call and
// redis-µs/key; server-µs/key is the whole server's CPU (INFO cpu, user + sys) per key, which also
// counts what commandstats leaves out: reading the requests, building the arguments, writing the
// replies, and any other client's work. Run with -benchtime=Nx so every run does the same work, and repeat (-count): the
// figures are as noisy as the machine.
//
// HYBRIDRATE_BENCH_REDIS=host:port runs against that server instead of one started for the benchmark
// (its statistics are reset). HYBRIDRATE_BENCH_PAUSE=30ms sleeps that long before each node's
// calls, so that Redis idles between them as it does under a hybrid fleet (a few rounds a second
// per node), and each node's round is one script call (keys-per-call keys, not 200): on this VM a
// call then costs Redis about 4× what it costs back to back (docs/benchmarks.md).
func BenchmarkReconcileRedisCPU(b *testing.B) {
	var rdb *redis.Client
	if addr := os.Getenv("HYBRIDRATE_BENCH_REDIS"); addr != "" {
		rdb = redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 16})
		b.Cleanup(func() { _ = rdb.Close() })
	} else {
		_, rdb = startRedis(b)
	}
	const nodes, nkeys = 8, 200
	var pause time.Duration
	if v := os.Getenv("HYBRIDRATE_BENCH_PAUSE"); v != "" {
		var err error
		if pause, err = time.ParseDuration(v); err != nil || pause < 0 {
			b.Fatalf("HYBRIDRATE_BENCH_PAUSE=%q: want a duration such as 30ms", v)
		}
	}
	keys := names(nkeys)
	ctx := context.Background()
	for _, perCall := range []int{1, 5, 20} {
		for _, n := range []int64{0, 1} {
			b.Run(fmt.Sprintf("keys-per-call=%d/n=%d", perCall, n), func(b *testing.B) {
				nk := nkeys
				if pause > 0 {
					nk = perCall // one script call per node and round, after the pause
				}
				inc := incarnation.Add(1) // a fresh prefix per run: b.N ramp-up calls this function again
				prefix := "cpu" + strconv.FormatUint(inc, 10)
				type node struct {
					c    *central.Client
					ups  []central.Update
					out  []central.State
					errs []error
				}
				ns := make([]*node, nodes)
				for i := range ns {
					c, err := central.New(central.Config{
						Client: rdb, Prefix: prefix, NodeID: "node" + strconv.Itoa(i),
						SyncTimeout: time.Second, FlushTimeout: 10 * time.Second, MaxBatch: perCall,
						PruneAge: 10 * time.Minute, Recount: time.Minute, ActiveWindow: 16 * time.Second,
						Horizon: 4 * time.Second,
						Breaker: redisx.BreakerConfig{Threshold: 5, Cooldown: 500 * time.Millisecond},
					})
					if err != nil {
						b.Fatal(err)
					}
					nd := &node{c: c, ups: make([]central.Update, nk), out: make([]central.State, nk),
						errs: make([]error, nk)}
					for k := range nd.ups {
						nd.ups[k] = central.Update{Key: keys[k], Limit: central.Limit{Rate: 1000, Burst: 500},
							Inc: 1, Demand: 12.5 + float64(i), Want: 20, N: n}
					}
					ns[i] = nd
				}
				round := func() {
					for _, nd := range ns {
						for k := range nd.ups {
							u := &nd.ups[k]
							u.Acked, u.UAcked = nd.out[k].Charged, u.Used
							u.Cum += 2
							u.Used = u.Cum
						}
						if pause > 0 {
							time.Sleep(pause)
						}
						if err := nd.c.Reconcile(ctx, nd.ups, nd.out, nd.errs); err != nil {
							b.Fatal(err)
						}
					}
				}
				round() // create the buckets and the node records outside the timer
				if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				cpu0 := serverCPU(b, rdb)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					round()
				}
				b.StopTimer()
				cpu := serverCPU(b, rdb) - cpu0
				calls, usec := evalshaStats(b, rdb)
				if want := int64(b.N * nodes * ((nk + perCall - 1) / perCall)); calls != want {
					b.Fatalf("%d EVALSHA calls, want %d", calls, want)
				}
				b.ReportMetric(float64(usec)/float64(calls), "redis-µs/call")
				b.ReportMetric(float64(usec)/float64(b.N*nodes*nk), "redis-µs/key")
				b.ReportMetric(cpu.Seconds()*1e6/float64(b.N*nodes*nk), "server-µs/key")
			})
		}
	}
}

// serverCPU returns the server's CPU time so far (INFO cpu, used_cpu_user + used_cpu_sys).
func serverCPU(tb testing.TB, rdb *redis.Client) time.Duration {
	tb.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	n := 0
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || k != "used_cpu_user" && k != "used_cpu_sys" {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			tb.Fatalf("INFO cpu %q: %v", line, err)
		}
		sum += f
		n++
	}
	if n != 2 {
		tb.Fatalf("INFO cpu: want used_cpu_user and used_cpu_sys, got %d of them", n)
	}
	return time.Duration(sum * 1e9)
}

// evalshaStats returns the calls and usec of EVALSHA from INFO commandstats.
func evalshaStats(tb testing.TB, rdb *redis.Client) (calls, usec int64) {
	tb.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				calls, err = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, err = strconv.ParseInt(v, 10, 64)
			}
			if err != nil {
				tb.Fatalf("commandstats %q: %v", line, err)
			}
		}
	}
	if calls == 0 {
		tb.Fatal("no EVALSHA in INFO commandstats")
	}
	return calls, usec
}

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
