package redisx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBreakerOnStateChange(t *testing.T) {
	now := time.Unix(0, 0)
	var got []BreakerEvent
	var b *Breaker
	b = NewBreaker(BreakerConfig{Threshold: 2, Cooldown: time.Second, OnStateChange: func(ev BreakerEvent) {
		assert.Equal(t, ev.To, b.State(), "the callback runs outside the lock, after the change")
		got = append(got, ev)
	}}, func() time.Time { return now })
	boom := errors.New("boom")
	b.Fail(errors.New("first"))
	require.Empty(t, got, "one failure: no change")
	b.Fail(boom)
	b.Success() // a call allowed before the breaker opened, answered late
	b.Fail(boom)
	b.Fail(boom)
	now = now.Add(time.Second)
	require.True(t, b.Allow())
	b.Fail(boom) // the probe fails
	now = now.Add(time.Second)
	require.True(t, b.Allow())
	b.Success()
	b.Success()

	type change struct {
		from, to BreakerState
		err      error
		failures int
	}
	var changes []change
	for _, ev := range got {
		changes = append(changes, change{ev.From, ev.To, ev.Err, ev.Failures})
	}
	assert.Equal(t, []change{
		{BreakerClosed, BreakerOpen, boom, 2},
		{BreakerOpen, BreakerClosed, nil, 0},
		{BreakerClosed, BreakerOpen, boom, 2},
		{BreakerOpen, BreakerHalfOpen, nil, 0},
		{BreakerHalfOpen, BreakerOpen, boom, 1},
		{BreakerOpen, BreakerHalfOpen, nil, 0},
		{BreakerHalfOpen, BreakerClosed, nil, 0},
	}, changes)
}

func TestBreakerRefusalNeedsNoSpan(t *testing.T) {
	now := time.Unix(0, 0)
	b := NewBreaker(BreakerConfig{Threshold: 3, Cooldown: time.Second, MinSpan: 50 * time.Millisecond}, func() time.Time { return now })
	for range 10 {
		b.Fail(context.DeadlineExceeded)
	}
	assert.Equal(t, BreakerClosed, b.State(), "simultaneous timeouts: a stall")
	b.Success()
	for range 3 {
		b.Fail(replyErr("WRONGPASS invalid username-password pair or user is disabled."))
	}
	assert.Equal(t, BreakerOpen, b.State(), "refusals open it at once")
}

func TestBreakerMinSpan(t *testing.T) {
	now := time.Unix(0, 0)
	b := NewBreaker(BreakerConfig{Threshold: 3, Cooldown: time.Second, MinSpan: 50 * time.Millisecond}, func() time.Time { return now })
	for range 10 { // a burst of simultaneous timeouts: many failures, no time between them
		require.True(t, b.Allow())
		b.Failure()
	}
	assert.Equal(t, BreakerClosed, b.State(), "a momentary stall does not open the breaker")
	now = now.Add(50 * time.Millisecond)
	require.True(t, b.Allow())
	b.Failure()
	assert.Equal(t, BreakerOpen, b.State(), "failures lasting MinSpan open it")
	assert.False(t, b.Allow(), "open: no calls")
	now = now.Add(time.Second)
	assert.True(t, b.Allow(), "after the cooldown, one probe")
	assert.False(t, b.Allow(), "only one")
	b.Success()
	assert.Equal(t, BreakerClosed, b.State())
	require.True(t, b.Allow())
	b.Failure()
	b.Success()
	now = now.Add(time.Hour)
	require.True(t, b.Allow())
	b.Failure()
	assert.Equal(t, BreakerClosed, b.State(), "a success resets the run")
}
