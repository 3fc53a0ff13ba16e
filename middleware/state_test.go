package middleware

import (
	"net/http"
	"testing"
	"time"
	"unsafe"

	"github.com/hybridrate/hybridrate/policy"
)

// TestStateSizes pins the request states to their size classes: a one-rule request's state with
// header room in 352 bytes, under the 512 above which Go's allocator writes a type header, and in
// 192 without (640 and 448 when the state held the check's scratch, 1,024 and 704 when it also had
// room for three decisions); see newState.
func TestStateSizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		size, max uintptr
	}{
		{"stateNarrow", unsafe.Sizeof(stateNarrow{}), 192},
		{"stateNarrowHeaders", unsafe.Sizeof(stateNarrowHeaders{}), 352},
		{"stateWide", unsafe.Sizeof(stateWide{}), 416},
		{"stateWideHeaders", unsafe.Sizeof(stateWideHeaders{}), 768},
	} {
		if c.size > c.max {
			t.Errorf("%s is %d bytes, want at most %d", c.name, c.size, c.max)
		}
	}
}

// TestNarrowHeaderRoom checks that a one-rule state's header room holds every value a request
// formats once the RateLimit-Policy and X-RateLimit-Limit values are cached, with 10-digit counts
// and a 24-byte rule name: writing them allocates nothing.
func TestNarrowHeaderRoom(t *testing.T) {
	m := &Middleware{}
	d := policy.Decision{Rule: "per-api-key-and-route-xx", Unit: "per-api-key-and-route-xx", Allowed: true,
		Limit: 1_000_000_000, Window: 86400 * time.Second, Remaining: 999_999_999, ResetAfter: 86399 * time.Second}
	var s stateNarrowHeaders
	res := policy.Result{Allowed: true, Decisions: []policy.Decision{d}}
	h := http.Header{}
	m.writeHeaders(h, AllHeaders, &res, &s.vals, s.buf[:0]) // fills the cache
	if a := testing.AllocsPerRun(100, func() { m.writeHeaders(h, AllHeaders, &res, &s.vals, s.buf[:0]) }); a != 0 {
		t.Errorf("writing the headers allocated %v times, want 0", a)
	}
	if got := h.Get("Ratelimit"); got != `"per-api-key-and-route-xx";r=999999999;t=86399` {
		t.Errorf("RateLimit %q", got)
	}
}
