package local

import (
	"testing"
	"unsafe"
)

// TestEntryLayout pins what docs/design.md's hot path and memory figures rely on: an Entry is 192
// bytes (a size class whose objects start on 64-byte boundaries), and every field Lookup, TryTake
// and Remaining read lies in its first 64 bytes, so a decision touches one cache line of its entry.
func TestEntryLayout(t *testing.T) {
	var e Entry
	if got := unsafe.Sizeof(e); got != 192 {
		t.Errorf("Entry is %d bytes, want 192", got)
	}
	if got := unsafe.Sizeof(rare{}); got > 64 {
		t.Errorf("rare is %d bytes, want at most 64", got)
	}
	hot := map[string]uintptr{
		"hash": unsafe.Offsetof(e.hash) + unsafe.Sizeof(e.hash), "flags": unsafe.Offsetof(e.flags) + unsafe.Sizeof(e.flags),
		"key": unsafe.Offsetof(e.key) + unsafe.Sizeof(e.key), "total": unsafe.Offsetof(e.total) + 8,
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
