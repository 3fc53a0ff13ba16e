package policy

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestHeaderSeconds pins the one rounding of every rate-limit header (the middleware's and the
// sidecar's): whole seconds rounded up, Retry-After at least 1, Reset from the later of reset and retry.
func TestHeaderSeconds(t *testing.T) {
	for _, c := range []struct {
		d           time.Duration
		ceil, retry int64
	}{
		{-time.Second, 0, 1},
		{0, 0, 1},
		{time.Nanosecond, 1, 1},
		{time.Second, 1, 1},
		{time.Second + time.Nanosecond, 2, 2},
		{90 * time.Second, 90, 90},
		{math.MaxInt64, math.MaxInt64/int64(time.Second) + 1, math.MaxInt64/int64(time.Second) + 1},
	} {
		assert.Equal(t, c.ceil, CeilSeconds(c.d), "CeilSeconds(%v)", c.d)
		assert.Equal(t, c.retry, RetryAfterSeconds(c.d), "RetryAfterSeconds(%v)", c.d)
	}
	d := Decision{ResetAfter: 1500 * time.Millisecond, RetryAfter: 2100 * time.Millisecond}
	assert.Equal(t, int64(3), d.ResetSeconds(), "the later of the two, rounded up")
	assert.Zero(t, (&Decision{}).ResetSeconds(), "a full quota resets now")
}
