package bench

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
)

// BenchmarkRSS reports the resident memory of a process holding one hybrid limiter as hybridrated
// holds it (the default cap, WithMaxKeys(DefaultMaxKeys) = 1,048,576 keys; the default sync
// interval, reconciling with a redis-server of its own), once the limiter tracks 1,048,576 keys, and
// after they went idle. Each key is a fresh string ("user:<n>", kept only by the limiter), decided
// once under 100/s. Metrics (MB, from /proc/self/status):
//   - rss-base-MB: the process before the limiter;
//   - rss-full-MB: with every key held, as the runtime left it (no forced GC); peak-MB: VmHWM;
//   - rss-full-gc-MB: the same after runtime/debug.FreeOSMemory (the floor at 1M keys);
//   - keys: the keys held at the end of the fill (at the cap, a full shard evicts clean keys: each
//     of the 64 shards holds at most 16,384);
//   - rss-idle-MB: after idle eviction (WithIdleEviction(30s): the fill takes longer than 2s on two
//     cores) dropped every key, and 20s more with no forced GC: what the runtime's scavenger gave
//     back by itself;
//   - rss-idle-gc-MB: the same after FreeOSMemory.
//
// Linux only; run it alone (other benchmarks' memory would count):
//
//	go test ./bench -run '^$' -bench 'BenchmarkRSS$' -benchtime 1x
func BenchmarkRSS(b *testing.B) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		b.Skip("needs /proc/self/status")
	}
	_, rdb := startRedis(b)
	for i := 0; i < b.N; i++ {
		debug.FreeOSMemory()
		base := status(b, "VmRSS")
		lim, err := hybrid.New(rdb, hybrid.WithKeyPrefix("rss"+strconv.Itoa(i)), hybrid.WithCheckTimeout(time.Second),
			hybrid.WithIdleEviction(30*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		const n = hybrid.DefaultMaxKeys
		limit := hybrid.PerSecond(100)
		for k := range n {
			if _, err := lim.Allow(ctx, "user:"+strconv.Itoa(k), limit); err != nil {
				b.Fatal(err)
			}
		}
		held := lim.Stats().Keys
		if held < n*9/10 {
			b.Fatalf("the limiter holds %d keys, want about %d", held, n)
		}
		full, peak := status(b, "VmRSS"), status(b, "VmHWM")
		debug.FreeOSMemory()
		fullGC := status(b, "VmRSS")
		deadline := time.Now().Add(3 * time.Minute)
		for lim.Stats().Keys > 0 {
			if time.Now().After(deadline) {
				b.Fatalf("%d keys still held 3 minutes after the last use (pending %d)", lim.Stats().Keys, lim.Stats().Pending)
			}
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(20 * time.Second)
		idle := status(b, "VmRSS")
		debug.FreeOSMemory()
		idleGC := status(b, "VmRSS")
		ctxc, cancel := context.WithTimeout(ctx, 10*time.Second)
		_ = lim.Close(ctxc)
		cancel()
		runtime.KeepAlive(lim)
		b.ReportMetric(float64(held), "keys")
		b.ReportMetric(base, "rss-base-MB")
		b.ReportMetric(full, "rss-full-MB")
		b.ReportMetric(peak, "peak-MB")
		b.ReportMetric(fullGC, "rss-full-gc-MB")
		b.ReportMetric(idle, "rss-idle-MB")
		b.ReportMetric(idleGC, "rss-idle-gc-MB")
		b.ReportMetric(0, "ns/op")
	}
}

// status returns a field of /proc/self/status given in kB (VmRSS, VmHWM), in MB.
func status(tb testing.TB, field string) float64 {
	tb.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 64)
		if err != nil {
			tb.Fatal(err)
		}
		return kb / 1024
	}
	tb.Fatalf("no %s in /proc/self/status", field)
	return 0
}
