package sidecar

import (
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestUnitOfMatchesTheEnum checks unitOf's shortcut against the enum's own names, in every case.
func TestUnitOfMatchesTheEnum(t *testing.T) {
	t.Parallel()
	for name, v := range rlsv3.RateLimitResponse_RateLimit_Unit_value {
		for _, spelling := range []string{name, strings.ToLower(name), strings.ToUpper(name[:1]) + strings.ToLower(name[1:])} {
			if got, want := unitOf(spelling), rlsv3.RateLimitResponse_RateLimit_Unit(v); got != want {
				t.Errorf("unitOf(%q) = %v, want %v", spelling, got, want)
			}
		}
	}
	if got := unitOf("fortnight"); got != rlsv3.RateLimitResponse_RateLimit_UNKNOWN {
		t.Errorf("unitOf(%q) = %v, want UNKNOWN", "fortnight", got)
	}
}
