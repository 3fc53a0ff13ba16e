package hybrid

import (
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// TestFallbackBucketCharges runs an outcome.LocalFallback bucket (one node's share: 25/s, capacity 50)
// through an outage and checks what of its admissions it charges as debt: the largest drawdown
// below where it would stand with no admissions, never more than its capacity.
func TestFallbackBucketCharges(t *testing.T) {
	t.Parallel()
	const r, b = 25.0, int64(50)
	for _, tc := range []struct {
		name           string
		s0             int64         // tokens at the start
		every          time.Duration // one request per
		outage         time.Duration
		admitted       int64 // want, ±1
		chargedAtLeast int64
		chargedAtMost  int64
	}{
		// Under its share (15/s of 25/s): the bucket stays near full; a token or two is charged.
		{"a key under its limit, from a full bucket", 50, time.Second / 15, 6 * time.Second, 90, 0, 2},
		// Over it (100/s): the bucket is emptied and stays empty; its capacity is charged, the
		// refill (150 tokens over 6 s) is not.
		{"a hot key, from an empty bucket", 0, time.Second / 100, 6 * time.Second, 150, 50, 50},
		{"a hot key, from a full bucket", 50, time.Second / 100, 6 * time.Second, 200, 50, 50},
		// A short outage on a busy key: the bucket never fills, every admission is charged, as
		// an exact bucket would have lost them.
		{"a short outage on a hot key", 0, time.Second / 100, time.Second, 25, 24, 25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(1_000_000, 0)
			fb := &fallbackBucket{start: start, lim: rate.NewLimiter(rate.Limit(r), int(b)), r: r, b: float64(b)}
			if k := int(b - tc.s0); k > 0 {
				fb.lim.AllowN(start, k)
			}
			fb.s0 = fb.lim.TokensAt(start)
			var admitted, charged int64
			for at := start; at.Sub(start) < tc.outage; at = at.Add(tc.every) {
				ok, _, excused := fb.take(at, r, b, 1)
				if !ok {
					continue
				}
				if excused < 0 || excused > 1 {
					t.Fatalf("at %v: excused %d of 1", at.Sub(start), excused)
				}
				admitted++
				charged += 1 - excused
			}
			if d := admitted - tc.admitted; d < -1 || d > 1 {
				t.Errorf("admitted %d, want %d±1", admitted, tc.admitted)
			}
			if charged < tc.chargedAtLeast || charged > tc.chargedAtMost {
				t.Errorf("charged %d of %d admitted, want %d to %d", charged, admitted, tc.chargedAtLeast, tc.chargedAtMost)
			}
			t.Logf("admitted %d, charged %d", admitted, charged)
		})
	}
}
