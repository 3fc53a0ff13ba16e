package middleware

import (
	"testing"
	"unsafe"
)

// TestStateSizes pins the request states to their size classes: a one-rule request's state with
// header room in 384 bytes, under the 512 above which Go's allocator writes a type header, and in
// 192 without (640 and 448 when the state held the check's scratch, 1,024 and 704 when it also had
// room for three decisions); see newState.
func TestStateSizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		size, max uintptr
	}{
		{"stateNarrow", unsafe.Sizeof(stateNarrow{}), 192},
		{"stateNarrowHeaders", unsafe.Sizeof(stateNarrowHeaders{}), 384},
		{"stateWide", unsafe.Sizeof(stateWide{}), 416},
		{"stateWideHeaders", unsafe.Sizeof(stateWideHeaders{}), 768},
	} {
		if c.size > c.max {
			t.Errorf("%s is %d bytes, want at most %d", c.name, c.size, c.max)
		}
	}
}
