package strict

import (
	"context"
	"fmt"
	"testing"
	"time"

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
