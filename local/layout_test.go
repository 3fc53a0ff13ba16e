package local

import (
	"math"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEntryLayout pins what docs/design.md's hot path and memory figures rely on: an Entry is 128
// bytes (a size class whose objects start on 64-byte boundaries), and every field Lookup, TryTake
// and Remaining read lies in its first 64 bytes, so a decision touches one cache line of its entry;
// the calls part fits the 48-byte size class, and each of the shared locks fills whole cache lines.
func TestEntryLayout(t *testing.T) {
	var e Entry
	if got := unsafe.Sizeof(e); got != 128 {
		t.Errorf("Entry is %d bytes, want 128", got)
	}
	if got := unsafe.Sizeof(rare{}); got > 64 {
		t.Errorf("rare is %d bytes, want at most 64", got)
	}
	if got := unsafe.Sizeof(calls{}); got > 48 {
		t.Errorf("calls is %d bytes, want at most 48", got)
	}
	if got := unsafe.Sizeof(stripe{}); got%64 != 0 {
		t.Errorf("stripe is %d bytes, want a multiple of 64", got)
	}
	hot := map[string]uintptr{
		"hash": unsafe.Offsetof(e.hash) + unsafe.Sizeof(e.hash), "flags": unsafe.Offsetof(e.flags) + unsafe.Sizeof(e.flags),
		"key": unsafe.Offsetof(e.key) + unsafe.Sizeof(e.key), "word": unsafe.Offsetof(e.word) + 8,
		"mark": unsafe.Offsetof(e.mark) + 8, "rate": unsafe.Offsetof(e.rate) + 8,
		"burst": unsafe.Offsetof(e.burst) + 8, "remBase": unsafe.Offsetof(e.remBase) + 8,
	}
	for name, end := range hot {
		if end > 64 {
			t.Errorf("hot field %s ends at byte %d, past the first cache line", name, end)
		}
	}
	s, err := New(Config{MaxKeys: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		k := string(rune('a'+i%26)) + string(rune('a'+i/26))
		if p := uintptr(unsafe.Pointer(s.Insert(k, s.Hash(k), 100, 100, 0))); p%64 != 0 {
			t.Fatalf("entry %d at %#x: not 64-byte aligned", i, p)
		}
	}
}

// TestRarePartOnFirstNeed: an entry that is only ever allowed has no rare part, and reads its values
// as zero; the first denial allocates it, and the next call counts that denial once.
func TestRarePartOnFirstNeed(t *testing.T) {
	s := newStore(t, 1024)
	e := insert(t, s, "k")
	grant(e, 10, 0, 10_000_000)
	require.Equal(t, Taken, e.TryTake(1))
	c := e.Next(2)
	e.Grant(Answer{Seq: c.Seq, Charged: 10, Global: 9_000_000, Active: 3, SentUsed: c.Used, At: 2,
		LeaseUntil: math.MaxInt64})
	assert.Nil(t, e.rare.Load(), "allowed and answered without a retry time: no rare part")
	assert.Zero(t, e.Denied())
	assert.Zero(t, e.RetryAt())
	assert.Zero(t, e.Waiters())
	assert.Zero(t, e.DirectRate(2, 1e9))

	e.Deny(4)
	require.NotNil(t, e.rare.Load(), "a denial allocates it")
	assert.EqualValues(t, 4, e.Denied())
	assert.True(t, e.Active(), "the denial is news to the next call")
	e.Next(3)
	assert.False(t, e.Active(), "counted once")
}

// TestActiveKeepsTheFlags: the nodes active on the key, kept above the flag bits, change without
// touching the flags, and the flags change without touching them; the count is capped.
func TestActiveKeepsTheFlags(t *testing.T) {
	var f flags
	f.set(fDirty | fThin)
	f.setActive(12)
	assert.EqualValues(t, 12, f.active())
	assert.True(t, f.has(fDirty) && f.has(fThin))
	assert.False(t, f.has(fUsed) || f.has(fEvicted))
	f.clear(fDirty)
	f.set(fUsed)
	assert.EqualValues(t, 12, f.active())
	f.setActive(1 << 40)
	assert.EqualValues(t, maxActive, f.active())
	f.setActive(-5)
	assert.Zero(t, f.active())
	assert.True(t, f.has(fUsed) && f.has(fThin))
}
