package local

import (
	"hash/maphash"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/hybridrate/hybridrate/internal/cputime"
)

// BenchmarkTake measures the store's share of a local decision, and its parts: the key's hash, the
// lookup and the take, on 1,024 keys and on one hot key.
//
//	go test -run '^$' -bench BenchmarkTake -benchmem -count 6 ./local/
func BenchmarkTake(b *testing.B) {
	for _, n := range []int{1, 1024} {
		s, err := New(Config{MaxKeys: 1 << 20})
		if err != nil {
			b.Fatal(err)
		}
		keys := make([]string, n)
		hs := make([]uint64, n)
		for i := range keys {
			keys[i] = "user:" + strconv.Itoa(i*7919)
			hs[i] = s.Hash(keys[i])
			s.Insert(keys[i], hs[i], 1e9, 1e9, 1<<62)
		}
		mask := n - 1
		name := "keys=" + strconv.Itoa(n)
		b.Run(name+"/op=hash", func(b *testing.B) {
			b.ReportAllocs()
			var x uint64
			for i := 0; i < b.N; i++ {
				x += s.Hash(keys[i&mask])
			}
			sinkU64.Store(x)
		})
		b.Run(name+"/op=maphash", func(b *testing.B) { // what Hash was before issue 24
			b.ReportAllocs()
			var x uint64
			for i := 0; i < b.N; i++ {
				x += maphash.String(s.seed, keys[i&mask])
			}
			sinkU64.Store(x)
		})
		b.Run(name+"/op=lookup", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if s.Lookup(keys[i&mask], hs[i&mask]) == nil {
					b.Fatal("missing")
				}
			}
		})
		b.Run(name+"/op=take", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if s.Take(keys[i&mask], hs[i&mask], 1e9, 1e9, 1) == nil {
					b.Fatal("not taken")
				}
			}
		})
		b.Run(name+"/op=hash+take", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				k := keys[i&mask]
				if s.Take(k, s.Hash(k), 1e9, 1e9, 1) == nil {
					b.Fatal("not taken")
				}
			}
		})
		b.Run(name+"/op=hash+take/parallel", func(b *testing.B) {
			b.ReportAllocs()
			var off atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(off.Add(1) * 104_729)
				for pb.Next() {
					k := keys[i&mask]
					if s.Take(k, s.Hash(k), 1e9, 1e9, 1) == nil {
						b.Error("not taken")
						return
					}
					i++
				}
			})
			b.ReportMetric(float64(s.Stats().Splits.Load()), "splits") // keys split so far (see split)
		})
	}
}

var sinkU64 atomic.Uint64

// BenchmarkTakeMany measures the store's share of a local decision on 262,144 keys taken in a
// random order, where the table's slots and the entries are mostly cache misses (the tables are
// about half full: a lookup loads about half an entry besides its own, docs/benchmarks.md's fifth
// issue-24 pass). Its instructions and misses per decision: run it under cachegrind at two
// -test.benchtime counts and take the difference.
//
//	go test -run '^$' -bench BenchmarkTakeMany -benchmem -count 6 ./local/
func BenchmarkTakeMany(b *testing.B) {
	const n = 1 << 18
	s, err := New(Config{MaxKeys: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i*7919)
		s.Insert(keys[i], s.Hash(keys[i]), 1e9, 1e9, 1<<62)
	}
	r := rand.New(rand.NewPCG(1, 2))
	seq := make([]int32, 1<<20)
	for i := range seq {
		seq[i] = int32(r.IntN(n))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := keys[seq[i&(len(seq)-1)]]
		if s.Take(k, s.Hash(k), 1e9, 1e9, 1) == nil {
			b.Fatal("not taken")
		}
	}
}

// BenchmarkTakeSplit measures Store.Take on one hot key whose allowance is split per core
// (Entry.Split) beside the same key unsplit: serially, what a split costs one core, and on every P,
// what it saves them (an unsplit key splits itself under contention, so its parallel row is the
// split one's; the figure before splitting existed is the previous build's keys=1 parallel row).
// cpu-ns/op is the process's CPU time per take, both cores' in the parallel rows.
//
//	go test -run '^$' -bench BenchmarkTakeSplit -benchmem -count 6 ./local/
func BenchmarkTakeSplit(b *testing.B) {
	for _, split := range []bool{false, true} {
		s, err := New(Config{MaxKeys: 1 << 10})
		if err != nil {
			b.Fatal(err)
		}
		const k = "user:hot"
		h := s.Hash(k)
		e := s.Insert(k, h, 1e9, 1e9, 1<<62)
		if split {
			e.doSplit()
		}
		name := "split=" + strconv.FormatBool(split)
		b.Run(name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			cpu := cputime.Process()
			for i := 0; i < b.N; i++ {
				if s.Take(k, h, 1e9, 1e9, 1) == nil {
					b.Fatal("not taken")
				}
			}
			cputime.Report(b, cpu)
		})
		if !split {
			continue
		}
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			cpu := cputime.Process()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if s.Take(k, h, 1e9, 1e9, 1) == nil {
						b.Error("not taken")
						return
					}
				}
			})
			cputime.Report(b, cpu)
		})
	}
}
