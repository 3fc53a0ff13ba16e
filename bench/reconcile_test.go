package bench

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/redisx"
)

// incarnation numbers the benchmark's runs, as a limiter numbers its local entries.
var incarnation atomic.Uint64

// BenchmarkReconcile measures the background sync's Redis side: one call of
// central.Client.Reconcile applies a consumed delta to 4,096 keys in one pipeline, in script calls
// of keys-per-call keys each. keys-per-call=1 is the pipelined one-key-per-EVALSHA baseline of
// DESIGN.md; 256 is what package hybrid uses. The figure to read is keys/s.
func BenchmarkReconcile(b *testing.B) {
	_, rdb := startRedis(b)
	const batch = 4096
	keys := names(batch)
	for _, perCall := range []int{1, 16, 256, 1000} {
		b.Run("keys-per-call="+strconv.Itoa(perCall), func(b *testing.B) {
			c, err := central.New(central.Config{
				Client: rdb, Prefix: "benchrec" + strconv.Itoa(perCall), NodeID: "bench",
				SyncTimeout: time.Second, FlushTimeout: 10 * time.Second, MaxBatch: perCall,
				PruneAge: 10 * time.Minute, Recount: time.Minute, ActiveWindow: 16 * time.Second, Horizon: 4 * time.Second,
				Breaker: redisx.BreakerConfig{Threshold: 5, Cooldown: 500 * time.Millisecond},
			})
			if err != nil {
				b.Fatal(err)
			}
			ups := make([]central.Update, batch)
			out := make([]central.State, batch)
			errs := make([]error, batch)
			inc := incarnation.Add(1) // b.N ramp-up calls this function again: start a new incarnation
			for i := range ups {
				ups[i] = central.Update{Key: keys[i], Limit: central.Limit{Rate: 1e9, Burst: 1e9}, Inc: inc}
			}
			ctx := context.Background()
			round := func() {
				for i := range ups {
					ups[i].Acked, ups[i].UAcked = ups[i].Cum, ups[i].Used
					ups[i].Cum += 3 // three tokens consumed on every key since the last round (as debt)
					ups[i].Used = ups[i].Cum
				}
				if err := c.Reconcile(ctx, ups, out, errs); err != nil {
					b.Fatal(err)
				}
				for i := range out {
					if out[i].Charged != ups[i].Cum {
						b.Fatalf("key %d: charged %d, want %d", i, out[i].Charged, ups[i].Cum)
					}
				}
			}
			round() // load the script and create the keys outside the timer
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				round()
			}
			b.ReportMetric(float64(batch)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
			b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N)/batch, "ns/key")
		})
	}
}
