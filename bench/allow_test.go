package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/cputime"
	"github.com/hybridrate/hybridrate/outcome"
)

// keySet is a set of keys and the sequence in which the benchmarks visit them.
type keySet struct {
	name string
	n    int
	seq  func() []int32 // key indexes, len seqLen
	warm func(seq []int32) []int32
}

var keySets = []keySet{
	{"keys=1k", smallKeys, func() []int32 { return uniformSeq(smallKeys) }, func([]int32) []int32 { return all(smallKeys) }},
	{"keys=1M-zipf", largeKeys, func() []int32 { return zipfSeq(largeKeys, zipfS) }, distinct},
	{"keys=hot", 1, func() []int32 { return make([]int32, seqLen) }, func([]int32) []int32 { return all(1) }},
}

// BenchmarkAllow measures one decision on a key that has local allowance: hybrid (with its
// background sync running at the default interval), a per-key map of x/time/rate limiters behind a
// mutex (what users write), a sync.Map of them (impl=xrate-syncmap), and a bare Go map lookup of a
// pointer, on the same key sequences. The hybrid rows call Allow (a bool). impl=hybrid-nosync is
// hybrid with a 1-minute sync interval: the hot path alone, without the background reconcile
// competing for the two cores; impl=hybrid-nosync-decide the same limiter called through Decide
// (the whole answer, a Decision); impl=hybrid-nosync-ban the same with one other key banned, as a
// service usually has some key banned or denied (the deny cache is not empty).
//
// Each implementation holds the keys its sequence visits before the timer starts: all 1,024 of
// keys=1k, and for keys=1M-zipf (a 2^20-key space drawn with Zipf s=1.1) the 143,067 distinct keys
// of the 2^20-draw sequence, which hybrid brings in with one Redis round trip each. Hybrid's sync
// timeout is 1s so that the warm-up does not trip its breaker on a busy machine; it plays no part
// in a local decision.
func BenchmarkAllow(b *testing.B) {
	_, rdb := startRedis(b)
	for _, ks := range keySets {
		b.Run(ks.name, func(b *testing.B) {
			keys := names(ks.n)
			if ks.n == 1 {
				keys = []string{"hot"}
			}
			seq := ks.seq()
			for _, v := range []struct {
				name string
				sync time.Duration
				ban  bool // another key is banned (held in the limiter's deny cache)
			}{{"impl=hybrid", hybrid.DefaultSyncInterval, false}, {"impl=hybrid-nosync", time.Minute, false},
				{"impl=hybrid-nosync-ban", time.Minute, true}} {
				var (
					once sync.Once
					lim  *hybrid.Limiter
				)
				parent := b // the limiter lives until the key set's rows are done (-decide shares it)
				setup := func(b *testing.B) {
					once.Do(func() {
						var err error
						lim, err = hybrid.New(rdb, hybrid.WithKeyPrefix("bench"+ks.name[5:]+v.name[5:]),
							hybrid.WithCheckTimeout(time.Second), hybrid.WithSyncInterval(v.sync))
						if err != nil {
							b.Fatal(err)
						}
						parent.Cleanup(func() {
							ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
							defer cancel()
							_ = lim.Close(ctx)
						})
						warm(b, lim, keys, ks.warm(seq))
						if v.ban {
							if err := lim.Ban(context.Background(), "not-one-of-the-keys", time.Hour); err != nil {
								b.Fatal(err)
							}
						}
					})
				}
				b.Run(v.name, func(b *testing.B) {
					setup(b)
					benchDecide(b, keys, seq, func(key string) bool {
						ok, err := lim.Allow(context.Background(), key, generous)
						return err == nil && ok
					})
				})
				if v.name != "impl=hybrid-nosync" {
					continue
				}
				// The same limiter, asked for the whole answer (Decide: a Decision, 56 bytes).
				b.Run(v.name+"-decide", func(b *testing.B) {
					setup(b)
					benchDecide(b, keys, seq, func(key string) bool {
						d, err := lim.Decide(context.Background(), key, generous)
						return err == nil && d.Allowed
					})
				})
			}
			b.Run("impl=xrate-map", func(b *testing.B) {
				m := newXRateMap(rate.Limit(generous.Rate), int(generous.Burst))
				for _, k := range ks.warm(seq) {
					m.allow(keys[k])
				}
				benchDecide(b, keys, seq, m.allow)
			})
			b.Run("impl=xrate-syncmap", func(b *testing.B) {
				m := &xrateSyncMap{limit: rate.Limit(generous.Rate), burst: int(generous.Burst)}
				for _, k := range ks.warm(seq) {
					m.allow(keys[k])
				}
				benchDecide(b, keys, seq, m.allow)
			})
			b.Run("impl=go-map", func(b *testing.B) {
				held := ks.warm(seq)
				m := make(map[string]*slot, len(held))
				for _, k := range held {
					m[keys[k]] = &slot{}
				}
				benchDecide(b, keys, seq, func(key string) bool { return m[key] != nil })
			})
		})
	}
}

type slot struct{ _ [8]byte }

// benchDecide runs decide over seq, serially and with b.RunParallel; it fails b on a denial.
//
// Beside ns/op (wall clock) it reports cpu-ns/op: the CPU time the whole process spent (every
// thread: the decisions, the collector, the limiter's background work), per decision. On a machine
// shared with other work, wall clock also counts the time the process waited for a core; CPU time
// does not, so it compares two binaries run alternately under load far better. In the parallel
// rows it adds up both goroutines' CPU: a parallel cpu-ns/op above the serial one is the cost of
// contention (two cores writing the same lines), whatever the machine's load.
func benchDecide(b *testing.B, keys []string, seq []int32, decide func(string) bool) {
	mask := len(seq) - 1
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer()
		cpu := cputime.Process()
		for i := 0; i < b.N; i++ {
			if !decide(keys[seq[i&mask]]) {
				b.Fatalf("decision %d denied", i)
			}
		}
		cputime.Report(b, cpu)
	})
	b.Run("parallel", func(b *testing.B) {
		var offset atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		cpu := cputime.Process()
		defer cputime.Report(b, cpu)
		b.RunParallel(func(pb *testing.PB) {
			i := int(offset.Add(1) * 104_729) // each goroutine starts elsewhere in the sequence
			for pb.Next() {
				if !decide(keys[seq[i&mask]]) {
					b.Errorf("decision denied")
					return
				}
				i++
			}
		})
	})
}

// xrateMap is a per-key map of x/time/rate limiters behind one mutex, as users write it.
type xrateMap struct {
	mu    sync.Mutex
	m     map[string]*rate.Limiter
	limit rate.Limit
	burst int
}

func newXRateMap(limit rate.Limit, burst int) *xrateMap {
	return &xrateMap{m: make(map[string]*rate.Limiter), limit: limit, burst: burst}
}

func (x *xrateMap) allow(key string) bool {
	x.mu.Lock()
	l := x.m[key]
	if l == nil {
		l = rate.NewLimiter(x.limit, x.burst)
		x.m[key] = l
	}
	x.mu.Unlock()
	return l.Allow()
}

// TestAllowLocalAllocatesNothing pins DESIGN.md's hot path: a decision from local allowance
// allocates nothing. The sync interval is long so that no background flush allocates meanwhile.
func TestAllowLocalAllocatesNothing(t *testing.T) {
	_, rdb := startRedis(t)
	lim := newLimiter(t, rdb, hybrid.WithSyncInterval(time.Minute))
	keys := names(smallKeys)
	warm(t, lim, keys, all(smallKeys))
	ctx := context.Background()
	i := 0
	var denied int
	allocs := testing.AllocsPerRun(10_000, func() {
		d, err := lim.Decide(ctx, keys[i&(smallKeys-1)], generous)
		if err != nil || d.Source != outcome.SourceLocal || !d.Allowed {
			denied++
		}
		i++
	})
	if denied > 0 {
		t.Fatalf("%d decisions were not local allows", denied)
	}
	if allocs != 0 {
		t.Errorf("Allow with local allowance: %v allocations per call, want 0", allocs)
	}
}

// BenchmarkAllowDenied measures a decision on a key over its limit (Rate 1/s, Burst 10, spent
// before the timer) on a node whose last answer from Redis for it said the bucket is empty: such
// decisions are denied locally for up to a second after that answer, then one asks Redis again
// (metric local-%: the share of decisions denied locally, the rest went to Redis). impl=hybrid-nosync
// without bans, impl=hybrid-nosync-ban with one other key banned. It reports cpu-ns/op as
// BenchmarkAllow does.
func BenchmarkAllowDenied(b *testing.B) {
	_, rdb := startRedis(b)
	over := hybrid.Limit{Rate: 1, Burst: 10}
	for _, v := range []struct {
		name string
		ban  bool
	}{{"impl=hybrid-nosync", false}, {"impl=hybrid-nosync-ban", true}} {
		var once sync.Once
		// The limiter belongs to the parent benchmark: a leaf benchmark's function runs once per
		// b.N tried, and the limiter must outlive the first.
		lim := newLimiter(b, rdb, hybrid.WithKeyPrefix("denied"+v.name[5:]),
			hybrid.WithCheckTimeout(time.Second), hybrid.WithSyncInterval(time.Minute))
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			once.Do(func() {
				if v.ban {
					if err := lim.Ban(ctx, "not-one-of-the-keys", time.Hour); err != nil {
						b.Fatal(err)
					}
				}
				deadline := time.Now().Add(10 * time.Second)
				for {
					d, err := lim.Decide(ctx, "over", over)
					if err != nil {
						b.Fatal(err)
					}
					if !d.Allowed && d.Source == outcome.SourceLocal {
						break // denied locally: the state the benchmark measures
					}
					if time.Now().After(deadline) {
						b.Fatalf("no local denial within 10s: %+v", d)
					}
				}
			})
			var local int
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cputime.Process()
			for i := 0; i < b.N; i++ {
				d, err := lim.Decide(ctx, "over", over)
				if err != nil {
					b.Fatal(err)
				}
				if !d.Allowed && d.Source == outcome.SourceLocal {
					local++
				}
			}
			cputime.Report(b, cpu)
			b.ReportMetric(100*float64(local)/float64(b.N), "local-%")
		})
	}
}
