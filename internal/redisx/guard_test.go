package redisx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

func TestGuardDoneCheck(t *testing.T) {
	t.Parallel()
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded} // a socket deadline
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name             string
		caller           context.Context
		err              error
		guard, checks    BreakerState // after one call with a threshold of 1
		guardProbeFreed  bool         // from half-open: the guard's probe slot is free again
		checksProbeFreed bool
	}{
		{"an answer closes both", context.Background(), nil, BreakerClosed, BreakerClosed, false, false},
		{"a per-key fault is an answer", context.Background(), errBadKey, BreakerClosed, BreakerClosed, false, false},
		{"a socket timeout fails the checks alone", context.Background(), timeout, BreakerHalfOpen, BreakerOpen, true, false},
		{"a context deadline fails the checks alone", context.Background(), fmt.Errorf("wrapped: %w", context.DeadlineExceeded), BreakerHalfOpen, BreakerOpen, true, false},
		{"a refused connection fails the guard", context.Background(), refused, BreakerOpen, BreakerHalfOpen, false, true},
		{"a refusal fails the guard", context.Background(), replyErr("OOM command not allowed"), BreakerOpen, BreakerHalfOpen, false, true},
		{"a cancelled caller is neither", cancelled, timeout, BreakerHalfOpen, BreakerHalfOpen, true, true},
		{"a caller past its deadline is neither", lateCtx{context.Background()}, timeout, BreakerHalfOpen, BreakerHalfOpen, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Both breakers open, then half-open: the call is the probe of both.
			now := time.Unix(0, 0)
			clock := func() time.Time { return now }
			b := NewBreaker(BreakerConfig{Threshold: 1, Cooldown: time.Second}, clock)
			checks := NewBreaker(BreakerConfig{Threshold: 1, Cooldown: time.Second}, clock)
			b.Fail(errors.New("x"))
			checks.Fail(errors.New("x"))
			now = now.Add(time.Second)
			g := NewGuard(b, nil)
			require.True(t, g.AllowCheck(checks), "the probe of both")
			g.DoneCheck(checks, tc.caller, tc.err)
			assert.Equal(t, tc.guard, b.State(), "the guard's breaker")
			assert.Equal(t, tc.checks, checks.State(), "the checks' breaker")
			if tc.guardProbeFreed {
				assert.True(t, g.Allow(), "the guard's probe slot was released: a background call may probe")
			}
			if tc.checksProbeFreed {
				assert.True(t, checks.Allow(), "the checks' probe slot was released")
			}
		})
	}
}

func TestGuardCheckTimeoutsDoNotOpenTheGuard(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 0)
	cfg := BreakerConfig{Threshold: 5, Cooldown: time.Second, MinSpan: 50 * time.Millisecond}
	b := NewBreaker(cfg, func() time.Time { return now })
	checks := NewBreaker(cfg, func() time.Time { return now })
	g := NewGuard(b, nil)
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	calls := 0
	for ; g.AllowCheck(checks); calls++ {
		require.Less(t, calls, 100)
		g.DoneCheck(checks, context.Background(), timeout)
		now = now.Add(10 * time.Millisecond)
	}
	assert.Equal(t, 6, calls, "the checks' breaker opens after 5 timeouts over 50ms")
	assert.Equal(t, BreakerOpen, checks.State(), "checks that time out fail fast")
	assert.Equal(t, BreakerClosed, b.State(), "the other calls go on")
	require.True(t, g.Allow())
	g.Done(context.Background(), nil)

	// The guard's breaker opens (background calls failed); the checks' cooldown passes: a check
	// turned away by the guard releases the checks' probe slot.
	opened := now.Add(-10 * time.Millisecond)
	for range 5 {
		b.Fail(errors.New("down"))
		now = now.Add(20 * time.Millisecond)
	}
	require.Equal(t, BreakerOpen, b.State())
	now = opened.Add(time.Second)
	assert.False(t, g.AllowCheck(checks), "the guard is open")
	assert.Equal(t, BreakerHalfOpen, checks.State())
	assert.True(t, checks.Allow(), "the checks' probe slot was not kept")
}

func TestTimedOut(t *testing.T) {
	t.Parallel()
	assert.True(t, TimedOut(&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}))
	assert.True(t, TimedOut(fmt.Errorf("central: take: %w", context.DeadlineExceeded)))
	assert.False(t, TimedOut(nil))
	assert.False(t, TimedOut(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}))
	assert.False(t, TimedOut(context.Canceled))
	assert.False(t, TimedOut(replyErr("BUSY Redis is busy running a script")))
}
