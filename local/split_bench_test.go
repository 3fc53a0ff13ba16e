package local

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkSlotPick compares the ways a take could pick its slot of a split (see split): one shared
// word (no split), a random slot per take (math/rand/v2, the runtime's per-M generator), a ticket
// kept per P in a sync.Pool (its Get and Put pin the P), and the stack hint the split uses
// (slotHint). Each op picks a slot among 8 padded ones and adds 1 to it with a CAS, serially and on
// every P.
//
//	go test -run '^$' -bench BenchmarkSlotPick -count 5 ./local/
func BenchmarkSlotPick(b *testing.B) {
	var one struct {
		_ [64]byte
		w atomic.Int64
		_ [56]byte
	}
	slots := make([]slot, 8)
	var tickets atomic.Uint32
	pool := sync.Pool{New: func() any { t := tickets.Add(1) % 8; return &t }}
	for _, m := range []struct {
		name string
		pick func() *atomic.Int64
	}{
		{"one", func() *atomic.Int64 { return &one.w }},
		{"rand", func() *atomic.Int64 { return &slots[rand.Uint32()%8].word }},
		{"pool", func() *atomic.Int64 {
			t := pool.Get().(*uint32)
			i := *t
			pool.Put(t)
			return &slots[i].word
		}},
		{"stack", func() *atomic.Int64 { return &slots[(slotHint()*0x9e3779b97f4a7c15)>>61].word }},
	} {
		add := func() {
			w := m.pick()
			for {
				v := w.Load()
				if w.CompareAndSwap(v, v+1) {
					return
				}
			}
		}
		b.Run("pick="+m.name+"/serial", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				add()
			}
		})
		b.Run("pick="+m.name+"/parallel", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					add()
				}
			})
		})
	}
}
