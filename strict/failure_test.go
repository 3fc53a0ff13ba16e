package strict

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
)

// TestHungRedisBounded: on a redis-server stopped with SIGSTOP (a hung host: it accepts connections
// and answers nothing), every call returns within a few times WithTimeout whatever the client's
// options (redistest.ClientSetups), where it used to wait for the client's ReadTimeout (forever without one);
// after SIGCONT calls are answered again.
func TestHungRedisBounded(t *testing.T) {
	redistest.ForEachClientSetup(t, func(t *testing.T, run redistest.ServerRun) {
		srv, rdb := run.Server, run.Client
		const timeout = 50 * time.Millisecond
		l, err := New(rdb, WithTimeout(timeout), WithBreaker(3, 100*time.Millisecond, 0))
		require.NoError(t, err)
		ctx := context.Background()
		rule := Rule{Name: "r", Algorithm: GCRA, Limit: 100, Period: time.Second}
		multi := []Check{{Rule: rule, Subject: "s", N: 1}, {Rule: Rule{Name: "w", Algorithm: SlidingWindow, Limit: 100, Period: time.Second}, Subject: "s", N: 1}}
		_, err = l.Allow(ctx, rule, "s")
		require.NoError(t, err)
		_, err = l.AllowMulti(ctx, "s", multi)
		require.NoError(t, err)

		srv.Pause(t)
		checkHungCalls(t, l, rule, "s", multi, 4*timeout, "on a hung Redis")

		srv.Resume(t)
		requireAnsweredAgain(t, l, rule, "s")
	})
}

// checkHungCalls checks, with Redis (or subject's master) hung, that Allow, through the breaker's
// opening and beyond, and then AllowMulti, a probe past the breaker's cooldown, fail with a
// transport error within bound. where ends the log lines ("on a hung Redis").
func checkHungCalls(t *testing.T, l *Limiter, rule Rule, subject string, multi []Check, bound time.Duration, where string) {
	t.Helper()
	ctx := context.Background()
	for i := range 6 { // through the breaker's opening and beyond
		redistest.Timed(t, fmt.Sprintf("Allow %d %s", i, where), bound, func() {
			_, err := l.Allow(ctx, rule, subject)
			assert.True(t, IsTransport(err), "attempt %d: %v", i, err)
		})
	}
	time.Sleep(150 * time.Millisecond) // past the breaker's cooldown: the next call is a probe
	redistest.Timed(t, "AllowMulti (a probe) "+where, bound, func() {
		_, err := l.AllowMulti(ctx, subject, multi)
		assert.True(t, IsTransport(err), "%v", err)
	})
}

// requireAnsweredAgain waits until Allow on rule and subject is answered, and allowed, again.
func requireAnsweredAgain(t *testing.T, l *Limiter, rule Rule, subject string) {
	t.Helper()
	require.Eventually(t, func() bool {
		res, err := l.Decide(context.Background(), rule, subject)
		return err == nil && res.Allowed
	}, 10*time.Second, 20*time.Millisecond, "answered again after SIGCONT")
}

// TestHungClusterBounded: TestHungRedisBounded on a Redis Cluster whose master for the subject's
// slot is stopped with SIGSTOP, for cluster clients with go-redis's defaults (ContextTimeoutEnabled
// false, ReadTimeout 5s), with no read timeout at all, and with ContextTimeoutEnabled: every call
// returns within 10 times WithTimeout (about once it, measured) (it took the client's 5s ReadTimeout, or forever, before
// the limiter used a cluster client of its own), and Close releases that client, never the
// caller's.
func TestHungClusterBounded(t *testing.T) {
	redistest.ForEachClusterSetup(t, func(t *testing.T, run redistest.ClusterRun) {
		cl, rdb, name := run.Cluster, run.Client, run.Name
		const timeout = 50 * time.Millisecond
		l, err := New(rdb, WithTimeout(timeout), WithBreaker(3, 100*time.Millisecond, 0))
		require.NoError(t, err)
		assert.Equal(t, !rdb.Options().ContextTimeoutEnabled, l.bounded.Owned, "a client of its own")
		ctx := context.Background()
		subject := "hung-" + name
		rule := Rule{Name: "r", Algorithm: GCRA, Limit: 100, Period: time.Second}
		multi := []Check{{Rule: rule, Subject: subject, N: 1}, {Rule: Rule{Name: "w", Algorithm: SlidingWindow, Limit: 100, Period: time.Second}, Subject: subject, N: 1}}
		require.Eventually(t, func() bool { // the first calls load the slot map and the scripts
			_, err1 := l.Decide(ctx, rule, subject)
			_, err2 := l.AllowMulti(ctx, subject, multi)
			return err1 == nil && err2 == nil
		}, 10*time.Second, 10*time.Millisecond, "warm-up")

		master := cl.MasterFor(t, "{"+subject+"}")
		master.Pause(t)
		// A tenth of the 5s ReadTimeout; room for a loaded machine and -race.
		checkHungCalls(t, l, rule, subject, multi, 10*timeout, "on a hung master")

		master.Resume(t)
		cl.WaitHealthy(t, 30*time.Second)
		requireAnsweredAgain(t, l, rule, subject)
		require.NoError(t, l.Close())
		require.NoError(t, rdb.Ping(ctx).Err(), "the caller's client is not closed")
	})
}

// TestStrictCallerGivingUpIsNotARedisFailure: a call whose caller gives up first (its own deadline,
// shorter than the limiter's timeout, passes, or it cancels) tells nothing about Redis: it neither
// counts towards opening the breaker (strict used to count a caller's deadline as a failure, so
// impatient callers could open it against a healthy Redis) nor resets a run of real failures.
func TestStrictCallerGivingUpIsNotARedisFailure(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := proxy.Client(t, redistest.NoRetries, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
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

// TestStrictClusterFailover: after the master of a subject's slot dies and a replica takes over, the
// limiter answers again within seconds. Strict used not to ask go-redis to reload the slot map after
// a failed call, so it kept dialling the dead master until go-redis's periodic reload (a minute).
func TestStrictClusterFailover(t *testing.T) {
	cl := redistest.StartFailoverCluster(t)
	cc := cl.Client(t, func(o *redis.ClusterOptions) { o.ContextTimeoutEnabled = true })
	l := newTestStrict(t, cc, WithTimeout(200*time.Millisecond))
	rule := Rule{Name: "r", Algorithm: GCRA, Limit: 1_000_000, Period: time.Second}
	const subject = "failover"
	ctx := context.Background()
	_, err := l.Allow(ctx, rule, subject)
	require.NoError(t, err)
	old := cl.MasterFor(t, key("t", subject, rule.Name, rule.Algorithm.code(), subject))

	killed := time.Now()
	old.Kill(t)
	// Calls while the cluster elects a new master: they fail, and each failure asks for a reload.
	for i := 0; i < 5; i++ {
		_, err := l.Allow(ctx, rule, subject)
		assert.Error(t, err, "the master is dead")
	}
	cl.WaitHealthy(t, 20*time.Second)
	healthy := time.Now()
	require.NotSame(t, old, cl.MasterFor(t, key("t", subject, rule.Name, rule.Algorithm.code(), subject)), "a replica took over")
	var lastErr error
	assert.Eventually(t, func() bool {
		_, lastErr = l.Decide(ctx, rule, subject)
		return lastErr == nil
	}, 10*time.Second, 20*time.Millisecond, "no successful call within 10s of the new master")
	require.NoError(t, lastErr, "the last call")
	t.Logf("master killed; new master serving after %v; strict answered again %v after that",
		healthy.Sub(killed).Round(time.Millisecond), time.Since(healthy).Round(time.Millisecond))
	for i := 0; i < 20; i++ {
		_, err := l.Allow(ctx, rule, subject)
		require.NoError(t, err, "once recovered, it stays recovered")
	}
}
