package middleware

import (
	"testing"
	"unsafe"
)

// TestStateSizes pins the request states to their size classes: a one-rule request's state with
// header room in 640 bytes, without in 448 (it took 1,024 and 704 when every state had room for
// three decisions); see newState.
func TestStateSizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		size, max uintptr
	}{
		{"stateNarrow", unsafe.Sizeof(stateNarrow{}), 448},
		{"stateNarrowHeaders", unsafe.Sizeof(stateNarrowHeaders{}), 640},
		{"stateWide", unsafe.Sizeof(stateWide{}), 704},
		{"stateWideHeaders", unsafe.Sizeof(stateWideHeaders{}), 1024},
	} {
		if c.size > c.max {
			t.Errorf("%s is %d bytes, want at most %d", c.name, c.size, c.max)
		}
	}
}
