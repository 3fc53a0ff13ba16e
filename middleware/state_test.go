package middleware

import (
	"net/http"
	"testing"
	"time"
	"unsafe"

	"github.com/hybridrate/hybridrate/policy"
)

// TestStateSizes pins the request states to their size classes, counting the 8-byte type header
// Go's allocator adds to an object over 512 bytes that holds pointers: a one-rule request's state
// with header room in 640 bytes, and in 512 without (the state and net/http's request copy were
// 352 + 320 and 192 + 320 bytes in two allocations); for a denied request, or under
// WithoutContextResult, the header values' storage in 144 and 320 bytes; see newState.
func TestStateSizes(t *testing.T) {
	const typeHeader = 8
	for _, c := range []struct {
		name      string
		size, max uintptr
	}{
		{"stateNarrow", unsafe.Sizeof(stateNarrow{}), 512},
		{"stateNarrowHeaders", unsafe.Sizeof(stateNarrowHeaders{}) + typeHeader, 640},
		{"stateWide", unsafe.Sizeof(stateWide{}) + typeHeader, 768},
		{"stateWideHeaders", unsafe.Sizeof(stateWideHeaders{}) + typeHeader, 1024},
		{"headerRoom", unsafe.Sizeof(headerRoom{}), 144},
		{"headerRoomWide", unsafe.Sizeof(headerRoomWide{}), 320},
	} {
		if c.size > c.max {
			t.Errorf("%s is %d bytes with its type header, want at most %d", c.name, c.size, c.max)
		}
	}
}

// TestNarrowHeaderRoom checks that a one-rule state's header room holds every value a request
// formats once the RateLimit-Policy and X-RateLimit-Limit values are cached, with 10-digit counts
// and a 34-byte rule name: writing them allocates nothing.
func TestNarrowHeaderRoom(t *testing.T) {
	m := &Middleware{}
	d := policy.Decision{Rule: "per-api-key-and-route-and-tier-xxx", Unit: "per-api-key-and-route-and-tier-xxx", Allowed: true,
		Limit: 1_000_000_000, Window: 86400 * time.Second, Remaining: 999_999_999, ResetAfter: 86399 * time.Second}
	var s stateNarrowHeaders
	res := policy.Result{Allowed: true, Decisions: []policy.Decision{d}}
	h := http.Header{}
	m.writeHeaders(h, AllHeaders, &res, &s.vals, s.buf[:0]) // fills the cache
	if a := testing.AllocsPerRun(100, func() { m.writeHeaders(h, AllHeaders, &res, &s.vals, s.buf[:0]) }); a != 0 {
		t.Errorf("writing the headers allocated %v times, want 0", a)
	}
	if got := h.Get("Ratelimit"); got != `"per-api-key-and-route-and-tier-xxx";r=999999999;t=86399` {
		t.Errorf("RateLimit %q", got)
	}
	if got, want := h.Get("X-Ratelimit-Remaining")+" "+h.Get("X-Ratelimit-Reset"), "999999999 86399"; got != want {
		t.Errorf("X-RateLimit-Remaining and -Reset %q, want %q", got, want)
	}
}
