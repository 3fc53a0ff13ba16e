package sidecar

import (
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/hybridrate/hybridrate/policy"
)

func TestCurrentLimitUnits(t *testing.T) {
	for _, c := range []struct {
		limit  int64
		window time.Duration
		want   uint32
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
		mult   uint32 // 0: none
	}{
		{100, time.Second, 100, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
		{3, time.Minute, 3, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0},
		{3, 59999999 * time.Microsecond, 3, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0}, // a float window
		{1000, time.Hour, 1000, rlsv3.RateLimitResponse_RateLimit_HOUR, 0},
		{5, 24 * time.Hour, 5, rlsv3.RateLimitResponse_RateLimit_DAY, 0},
		{100, 10 * time.Second, 100, rlsv3.RateLimitResponse_RateLimit_SECOND, 10},
		{5, 10 * time.Minute, 5, rlsv3.RateLimitResponse_RateLimit_MINUTE, 10},
		{1, 30 * 24 * time.Hour, 1, rlsv3.RateLimitResponse_RateLimit_DAY, 30},
		{5, 1666666666 * time.Nanosecond, 3, rlsv3.RateLimitResponse_RateLimit_SECOND, 0}, // burst 5 at 3/s
		{1, 2500 * time.Millisecond, 24, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0},
		{7, 0, 7, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
	} {
		got := currentLimit(&policy.Decision{Rule: "r", Limit: c.limit, Window: c.window})
		mult := uint32(0)
		if got.UnitMultiplier != nil {
			mult = got.UnitMultiplier.Value
		}
		if got.Unit != c.unit || got.RequestsPerUnit != c.want || mult != c.mult || got.Name != "r" {
			t.Errorf("%d per %v: got %d per %d×%v (%q), want %d per %d×%v", c.limit, c.window,
				got.RequestsPerUnit, mult, got.Unit, got.Name, c.want, c.mult, c.unit)
		}
	}
}

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
