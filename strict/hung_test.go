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

// TestHungRedisBounded: on a redis-server stopped with SIGSTOP (a hung host: it accepts connections
// and answers nothing), every call returns within a few times WithTimeout whatever the client's
// options (hungClients), where it used to wait for the client's ReadTimeout (forever without one);
// after SIGCONT calls are answered again.
func TestHungRedisBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range hungClients {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			rdb := srv.Client(t, tc.opt)
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
			const bound = 4 * timeout
			for i := range 6 { // through the breaker's opening and beyond
				start := time.Now()
				_, err := l.Allow(ctx, rule, "s")
				took := time.Since(start)
				t.Logf("Allow %d on a hung Redis: %v (%v)", i, took, err)
				assert.True(t, IsTransport(err), "attempt %d: %v", i, err)
				assert.Less(t, took, bound, "Allow %d on a hung Redis", i)
			}
			time.Sleep(150 * time.Millisecond) // past the breaker's cooldown: the next call is a probe
			start := time.Now()
			_, err = l.AllowMulti(ctx, "s", multi)
			took := time.Since(start)
			t.Logf("AllowMulti (a probe) on a hung Redis: %v (%v)", took, err)
			assert.True(t, IsTransport(err), "%v", err)
			assert.Less(t, took, bound, "AllowMulti on a hung Redis")

			srv.Resume(t)
			require.Eventually(t, func() bool {
				res, err := l.Allow(ctx, rule, "s")
				return err == nil && res.Allowed
			}, 10*time.Second, 20*time.Millisecond, "answered again after SIGCONT")
		})
	}
}

// hungClients are the client options TestHungRedisBounded runs with: go-redis's defaults
// (ContextTimeoutEnabled false: a call's deadline is not applied to the socket, ReadTimeout 3s), no
// read timeout at all (a call would wait forever), and ContextTimeoutEnabled.
var hungClients = []struct {
	name string
	opt  func(*redis.Options)
}{
	{"defaults", func(*redis.Options) {}},
	{"no read timeout", func(o *redis.Options) { o.ReadTimeout = -1 }},
	{"context timeouts", func(o *redis.Options) { o.ContextTimeoutEnabled = true }},
}

// TestHungClusterBounded: TestHungRedisBounded on a Redis Cluster whose master for the subject's
// slot is stopped with SIGSTOP, for cluster clients with go-redis's defaults (ContextTimeoutEnabled
// false, ReadTimeout 5s), with no read timeout at all, and with ContextTimeoutEnabled: every call
// returns within 10 times WithTimeout (about once it, measured) (it took the client's 5s ReadTimeout, or forever, before
// the limiter used a cluster client of its own), and Close releases that client, never the
// caller's.
func TestHungClusterBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	cl := redistest.StartCluster(t, 3, 0)
	for _, tc := range redistest.ClusterClientSetups {
		t.Run(tc.Name, func(t *testing.T) { // one at a time: they share the cluster
			rdb := cl.Client(t, tc.Opt)
			const timeout = 50 * time.Millisecond
			l, err := New(rdb, WithTimeout(timeout), WithBreaker(3, 100*time.Millisecond, 0))
			require.NoError(t, err)
			assert.Equal(t, !rdb.Options().ContextTimeoutEnabled, l.bounded.Owned, "a client of its own")
			ctx := context.Background()
			subject := "hung-" + tc.Name
			rule := Rule{Name: "r", Algorithm: GCRA, Limit: 100, Period: time.Second}
			multi := []Check{{Rule: rule, Subject: subject, N: 1}, {Rule: Rule{Name: "w", Algorithm: SlidingWindow, Limit: 100, Period: time.Second}, Subject: subject, N: 1}}
			require.Eventually(t, func() bool { // the first calls load the slot map and the scripts
				_, err1 := l.Allow(ctx, rule, subject)
				_, err2 := l.AllowMulti(ctx, subject, multi)
				return err1 == nil && err2 == nil
			}, 10*time.Second, 10*time.Millisecond, "warm-up")

			master := cl.MasterFor(t, "{"+subject+"}")
			master.Pause(t)
			const bound = 10 * timeout // a tenth of the 5s ReadTimeout; room for a loaded machine and -race
			for i := range 6 {         // through the breaker's opening and beyond
				start := time.Now()
				_, err := l.Allow(ctx, rule, subject)
				took := time.Since(start)
				t.Logf("Allow %d on a hung master: %v (%v)", i, took, err)
				assert.True(t, IsTransport(err), "attempt %d: %v", i, err)
				assert.Less(t, took, bound, "Allow %d on a hung master", i)
			}
			time.Sleep(150 * time.Millisecond) // past the breaker's cooldown: the next call is a probe
			start := time.Now()
			_, err = l.AllowMulti(ctx, subject, multi)
			took := time.Since(start)
			t.Logf("AllowMulti (a probe) on a hung master: %v (%v)", took, err)
			assert.True(t, IsTransport(err), "%v", err)
			assert.Less(t, took, bound, "AllowMulti on a hung master")

			master.Resume(t)
			cl.WaitHealthy(t, 30*time.Second)
			require.Eventually(t, func() bool {
				res, err := l.Allow(ctx, rule, subject)
				return err == nil && res.Allowed
			}, 10*time.Second, 20*time.Millisecond, "answered again after SIGCONT")
			require.NoError(t, l.Close())
			require.NoError(t, rdb.Ping(ctx).Err(), "the caller's client is not closed")
		})
	}
}
