package local

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTableLayout pins what the tagged probe's cost relies on (docs/design.md): a group's control
// word and its seven slots lie in one 64-byte cache line, at every table size, whichever way the
// allocator placed the array (newTable's off).
func TestTableLayout(t *testing.T) {
	if got := unsafe.Sizeof(group{}); got != 64 {
		t.Fatalf("group is %d bytes, want 64", got)
	}
	for n := 1; n <= 1<<14; n *= 2 {
		tab := newTable(n)
		for g := uint64(0); g <= tab.mask; g++ {
			line := uintptr(unsafe.Pointer(&tab.groups[g].ctrl)) / 64
			first := uintptr(unsafe.Pointer(tab.slot(g, 0))) / 64
			last := uintptr(unsafe.Pointer(tab.slot(g, groupSlots-1))) / 64
			if first != line || last != line {
				t.Fatalf("table of %d groups (off %d): group %d's control word and slots span lines %d..%d",
					n, tab.off, g, min(line, first), max(line, last))
			}
		}
	}
}

// TestMatch checks the control word's byte matching against a byte-by-byte reading, on random
// words of tags, empty and deleted bytes: every byte equal to the tag is reported (a rare extra
// report is allowed; the caller compares the entry), and no empty, deleted or pad byte ever is.
func TestMatch(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 100_000 {
		var c uint64
		for j := range 8 {
			var b uint64
			switch r.IntN(4) {
			case 0:
				b = ctrlEmpty
			case 1:
				b = ctrlDeleted
			default:
				b = uint64(r.IntN(4)) // few tags, so that matches and neighbours are common
			}
			if j == 7 {
				b = ctrlDeleted
			}
			c |= b << (8 * j)
		}
		tag := uint64(r.IntN(4))
		m, empty := matchTag(c, tag), matchEmpty(c)
		for j := range 8 {
			b := c >> (8 * j) & 0xff
			got := m>>(8*j+7)&1 == 1
			if b == tag && !got {
				t.Fatalf("c %#016x tag %d: byte %d matches and was not reported (%#016x)", c, tag, j, m)
			}
			if b >= 0x80 && got {
				t.Fatalf("c %#016x tag %d: byte %d (%#x) reported", c, tag, j, b)
			}
			if got, want := empty>>(8*j+7)&1 == 1, b == ctrlEmpty; got != want {
				t.Fatalf("c %#016x: byte %d empty %v, reported %v", c, j, want, got)
			}
		}
	}
}

// TestChurnKeepsEveryKey inserts and removes keys at random against a map, so that groups fill,
// get tombstones, have removed slots marked empty, are reused and rebuilt (grown and, by Sweep,
// shrunk): after every step, every key the map holds is found, by Lookup and by Insert, and no other.
func TestChurnKeepsEveryKey(t *testing.T) {
	s := newStore(t, 1<<16)
	r := rand.New(rand.NewPCG(5, 6))
	model := map[string]*Entry{}
	for step := range 60_000 {
		k := "k" + strconv.Itoa(r.IntN(3000))
		h := hash(s, k)
		if e, ok := model[k]; ok && r.IntN(2) == 0 {
			require.True(t, s.Remove(k, h), "step %d: remove %s", step, k)
			assert.True(t, e.Evicted())
			delete(model, k)
		} else {
			e := s.Insert(k, h, 100, 100, 0)
			require.NotNil(t, e)
			if ok {
				require.Same(t, model[k], e, "step %d: insert of present %s", step, k)
			}
			model[k] = e
		}
		if step%5000 == 4999 {
			for k, e := range model { // used since the last sweep: Sweep keeps them, and may shrink
				e.flags.set(fUsed)
				_ = k
			}
			s.Sweep(0, 0)
			require.Equal(t, len(model), s.Len())
			for k, e := range model {
				require.Same(t, e, s.Lookup(k, hash(s, k)), "step %d: lookup of %s", step, k)
			}
			for i := range 3000 {
				k := "k" + strconv.Itoa(i)
				if _, ok := model[k]; !ok {
					require.Nil(t, s.Lookup(k, hash(s, k)), "step %d: %s was removed", step, k)
				}
			}
		}
	}
}

// TestLookupsFindStableKeysUnderChurn: keys that stay in the store are found by every lock-free
// Lookup and Take while other keys of the same shards are inserted and removed around them
// (tombstones, slots freed and reused, tables rebuilt). A key inserted past a group is found even
// when that group's slots are removed and refilled meanwhile. Run it with -race.
func TestLookupsFindStableKeysUnderChurn(t *testing.T) {
	s := newStore(t, 1<<16)
	stable := make([]string, 500)
	for i := range stable {
		stable[i] = "stable-" + strconv.Itoa(i)
		e := insert(t, s, stable[i])
		e.mark.Store(1 << 40)
	}
	var (
		stop   atomic.Bool
		missed atomic.Int64
		looked atomic.Int64
		wg     sync.WaitGroup
	)
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; !stop.Load(); i++ {
				k := stable[i%len(stable)]
				h := s.Hash(k)
				if s.Lookup(k, h) == nil || s.Take(k, h, 100, 100, 1) == nil {
					missed.Add(1)
				}
				looked.Add(1)
			}
		}()
	}
	r := rand.New(rand.NewPCG(7, 8))
	for round := range 40 {
		for i := range 2000 {
			k := "churn-" + strconv.Itoa(round) + "-" + strconv.Itoa(i)
			s.Insert(k, s.Hash(k), 100, 100, 0)
		}
		for i := range 2000 {
			if r.IntN(8) != 0 {
				k := "churn-" + strconv.Itoa(round) + "-" + strconv.Itoa(i)
				s.Remove(k, s.Hash(k))
			}
		}
		if round%10 == 9 {
			for _, k := range stable {
				s.Lookup(k, s.Hash(k)).flags.set(fUsed)
			}
			s.Sweep(0, 0) // evicts nothing (no answer is old enough) but rebuilds tables full of tombstones
		}
	}
	stop.Store(true)
	wg.Wait()
	require.Positive(t, looked.Load())
	assert.Zero(t, missed.Load(), "lookups of keys present throughout that missed, of %d", looked.Load())
}

// TestKeysSharingTheirHashBits: two keys whose 32 kept hash bits are equal (found by a birthday
// search: same shard, group, tag and hash) each find their own entry, by Lookup, Insert and Take,
// whichever was inserted first (Take compares the key after its probe and goes to Lookup on a
// mismatch).
func TestKeysSharingTheirHashBits(t *testing.T) {
	s := newStore(t, 1<<16)
	seen := map[uint32]string{}
	var a, b string
	for i := 0; b == "" && i < 1<<22; i++ {
		k := "k" + strconv.Itoa(i)
		h := uint32(s.Hash(k))
		if o, ok := seen[h]; ok {
			a, b = o, k
		}
		seen[h] = k
	}
	require.NotEmpty(t, b, "no two keys with equal 32 hash bits found")
	for _, order := range [][2]string{{a, b}, {b, a}} {
		for _, k := range order {
			e := insert(t, s, k)
			e.mark.Store(100)
		}
		for _, k := range order {
			h := s.Hash(k)
			e := s.Lookup(k, h)
			require.NotNil(t, e)
			assert.Equal(t, k, e.Key())
			assert.Same(t, e, s.Insert(k, h, 100, 100, 0))
			assert.Same(t, e, s.Take(k, h, 100, 100, 1), "Take of %s", k)
			assert.EqualValues(t, 1, e.Total())
		}
		for _, k := range order {
			require.True(t, s.Remove(k, s.Hash(k)))
		}
	}
}
