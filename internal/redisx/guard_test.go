package redisx

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// lateCtx is a context whose deadline has passed but whose timer has not marked it done yet, as a
// socket deadline taken from it can observe.
type lateCtx struct{ context.Context }

func (lateCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Microsecond), true }

func TestGuardDone(t *testing.T) {
	t.Parallel()
	timeout := &net.OpError{Op: "read", Err: errors.New("i/o timeout")}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name   string
		caller context.Context
		err    error
		want   BreakerState
	}{
		{"a success closes", context.Background(), nil, BreakerClosed},
		{"a per-key fault is a success", context.Background(), errBadKey, BreakerClosed},
		{"a transport error is a failure", context.Background(), timeout, BreakerOpen},
		{"a refusal is a failure", context.Background(), replyErr("OOM command not allowed"), BreakerOpen},
		{"a cancelled caller is neither", cancelled, timeout, BreakerHalfOpen},
		{"a caller past its deadline is neither", lateCtx{context.Background()}, timeout, BreakerHalfOpen},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(0, 0)
			b := NewBreaker(BreakerConfig{Threshold: 1, Cooldown: time.Second}, func() time.Time { return now })
			b.Fail(errors.New("x"))
			now = now.Add(time.Second)
			g := NewGuard(b, nil)
			assert.True(t, g.Allow(), "the probe")
			g.Done(tc.caller, tc.err)
			assert.Equal(t, tc.want, b.State())
			if tc.want == BreakerHalfOpen {
				assert.True(t, g.Allow(), "the probe slot was released")
			}
		})
	}
}
