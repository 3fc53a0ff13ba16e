package strict

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
)

// TestStrictCallerGivingUpIsNotARedisFailure: a call whose caller gives up first (its own deadline,
// shorter than the limiter's timeout, passes, or it cancels) tells nothing about Redis: it neither
// counts towards opening the breaker (strict used to count a caller's deadline as a failure, so
// impatient callers could open it against a healthy Redis) nor resets a run of real failures.
func TestStrictCallerGivingUpIsNotARedisFailure(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	l := newTestStrict(t, rdb, WithTimeout(100*time.Millisecond), WithBreaker(3, time.Hour, 0))
	rule := Rule{Name: "r", Algorithm: GCRA, Limit: 10, Period: time.Second}
	ctx := context.Background()
	_, err := l.Allow(ctx, rule, "s") // loads the script
	require.NoError(t, err)

	proxy.SetLatency(time.Second) // every answer now comes after both deadlines
	deadline := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		_, err := l.Allow(ctx, rule, "s")
		require.Error(t, err)
	}
	cancelled := func() {
		t.Helper()
		ctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(10*time.Millisecond, cancel)
		defer cancel()
		_, err := l.Allow(ctx, rule, "s")
		require.Error(t, err)
	}
	timeout := func() { // the limiter's own timeout: Redis did not answer in time
		t.Helper()
		_, err := l.Allow(ctx, rule, "s")
		require.Error(t, err)
		require.True(t, IsTransport(err), "%v", err)
		require.ErrorIs(t, err, ErrUnavailable, "a call Redis could not serve wraps ErrUnavailable, as the open breaker's does")
	}

	for range 5 {
		deadline()
		cancelled()
	}
	assert.Equal(t, BreakerClosed, l.BreakerState(), "callers that gave up say nothing about Redis")
	timeout()
	timeout()
	deadline()
	cancelled()
	assert.Equal(t, BreakerClosed, l.BreakerState(), "two failures of three")
	timeout()
	assert.Equal(t, BreakerOpen, l.BreakerState(), "the callers that gave up did not reset the run of failures")
	assert.Equal(t, int64(15), l.Stats().Errors, "every failed call is counted as an error")
}
