package hybrid_test

// Issue 11 item 3: error replies with which a live Redis refuses to serve (OOM under noeviction,
// WRONGPASS, NOPERM) go to the failure policy and open the breaker, like a Redis that is down:
// AllowN returns no error, connections are not churned, and consumption admitted meanwhile reaches
// Redis once it accepts writes again.

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// infoStat returns a numeric field of INFO section (e.g. "stats", "total_connections_received").
func infoStat(t *testing.T, srv *redistest.Server, section, field string) int64 {
	t.Helper()
	info, _ := srv.Do(t, "INFO", section).(string)
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err, line)
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// runRefused drives a loader on keys for d and reports whether the breaker was seen open.
func runRefused(t *testing.T, lim *hybrid.Limiter, keys []string, limit hybrid.Limit, d time.Duration) (*loader, bool) {
	t.Helper()
	l := &loader{lim: lim, keys: keys, limit: limit, pace: 100 * time.Microsecond}
	l.start(2)
	opened := false
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		opened = opened || lim.Stats().BreakerOpen
	}
	l.halt()
	return l, opened
}

// TestRedisOOMGoesToFailurePolicy: a Redis at maxmemory under noeviction answers every script call
// with OOM. AllowN must not return it: the failure policy decides, the breaker opens, and what was
// admitted meanwhile is applied once Redis accepts writes again.
func TestRedisOOMGoesToFailurePolicy(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	rdb := srv.Client(t, redistest.NoRetries)
	// Strict mode (drift 0): every decision needs Redis, so every one meets the OOM.
	lim := newLimiter(t, rdb, hybrid.WithFailurePolicy(outcome.FailOpen), hybrid.WithDriftThreshold(0),
		hybrid.WithSyncInterval(5*time.Millisecond), hybrid.WithCheckTimeout(200*time.Millisecond))
	ctx := context.Background()
	limit := hybrid.Limit{Rate: 1, Burst: 1000}
	keys := keyNames("oom:", 16)
	var warmed int64
	for _, k := range keys {
		d, err := lim.Decide(ctx, k, limit)
		require.NoError(t, err)
		require.Equal(t, outcome.SourceCentral, d.Source)
		warmed++
	}
	flushed(t, lim, 5*time.Second)

	// Fill Redis up to a 1mb maxmemory.
	srv.Do(t, "CONFIG", "SET", "maxmemory", "1mb")
	filler := strings.Repeat("x", 10<<10)
	for i := 0; ; i++ {
		err := rdb.Set(ctx, "filler:"+strconv.Itoa(i), filler, 0).Err()
		if err != nil {
			require.Contains(t, err.Error(), "OOM", "the filler stops at maxmemory")
			break
		}
		require.Less(t, i, 10000, "Redis never reached maxmemory")
	}
	require.ErrorContains(t, rdb.EvalSha(ctx, "0000000000000000000000000000000000000000", nil).Err(), "NOSCRIPT")

	l, opened := runRefused(t, lim, keys, limit, time.Second)
	st := lim.Stats()
	t.Logf("while OOM: %v; stats %+v", l, st)
	assert.Zero(t, l.errs.Load(), "AllowN returned errors: %v", l.errors())
	assert.Positive(t, l.sources[outcome.SourceFallback].Load(), "the failure policy decided")
	assert.True(t, opened, "the breaker opened")
	assert.Positive(t, st.Pending, "consumption stays pending")

	srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
	flushed(t, lim, 10*time.Second)
	assert.Equal(t, warmed+l.total(), sum(consumed(t, rdb, keys)), "everything admitted reached Redis")
	assert.False(t, lim.Stats().BreakerOpen)
}

// TestWrongPasswordDoesNotChurnConnections: with a wrong password every dial fails in go-redis's
// handshake (WRONGPASS) and the connection is dropped. Such calls must open the breaker, or every
// decision dials a new connection; AllowN must not return the error. Once the breaker is open, the
// connections left are its probes (one per cooldown) and go-redis's Pub/Sub reconnecting for the ban
// channel (about 10/s).
func TestWrongPasswordDoesNotChurnConnections(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "secret")
	rdb := srv.Client(t, func(o *redis.Options) { o.Password, o.MaxRetries = "wrong", -1 })
	lim := newLimiter(t, rdb, hybrid.WithFailurePolicy(outcome.FailOpen), hybrid.WithDriftThreshold(0),
		hybrid.WithSyncInterval(5*time.Millisecond))

	l := &loader{lim: lim, keys: keyNames("pw:", 64), limit: hybrid.Limit{Rate: 1, Burst: 10}, pace: 100 * time.Microsecond}
	start := infoStat(t, srv, "stats", "total_connections_received")
	l.start(2)
	t0 := time.Now()
	for time.Since(t0) < 2*time.Second && !lim.Stats().BreakerOpen {
		time.Sleep(5 * time.Millisecond)
	}
	opening := time.Since(t0)
	before := infoStat(t, srv, "stats", "total_connections_received")
	const window = 2 * time.Second
	stayedOpen := true // open or half-open: never closed
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		stayedOpen = stayedOpen && lim.Stats().BreakerOpen
	}
	after := infoStat(t, srv, "stats", "total_connections_received")
	l.halt()
	conns := after - before - 1 // less our INFO
	t.Logf("wrong password: breaker open after %v and %d connections; then %d connections in %v (%.0f/s); %v; stats %+v",
		opening.Round(time.Millisecond), before-start-1, conns, window, float64(conns)/window.Seconds(), l, lim.Stats())
	assert.Zero(t, l.errs.Load(), "AllowN returned errors: %v", l.errors())
	assert.Positive(t, l.sources[outcome.SourceFallback].Load(), "the failure policy decided")
	assert.True(t, stayedOpen, "the breaker opened and stayed open")
	assert.Less(t, conns, int64(50), "connections received in %v", window)
	assert.Less(t, after-start-2, int64(50), "connections received from the first failure on")
}

// TestNoPermGoesToFailurePolicy: a user that may not run EVALSHA gets NOPERM on every call: the
// failure policy decides and the breaker opens.
func TestNoPermGoesToFailurePolicy(t *testing.T) {
	srv := redistest.Start(t)
	var acl []any
	for _, r := range limiterACL {
		if r != "+evalsha" {
			acl = append(acl, r)
		}
	}
	srv.Do(t, append([]any{"ACL", "SETUSER", "lim"}, acl...)...)
	rdb := srv.Client(t, redistest.As("lim", "pw"))
	require.ErrorContains(t, rdb.EvalSha(context.Background(), "0000000000000000000000000000000000000000", nil).Err(), "NOPERM")
	lim := newLimiter(t, rdb, hybrid.WithFailurePolicy(outcome.FailClosed), hybrid.WithDriftThreshold(0),
		hybrid.WithSyncInterval(5*time.Millisecond))

	l, opened := runRefused(t, lim, keyNames("noperm:", 16), hybrid.Limit{Rate: 1, Burst: 10}, time.Second)
	t.Logf("NOPERM: %v; stats %+v", l, lim.Stats())
	assert.Zero(t, l.errs.Load(), "AllowN returned errors: %v", l.errors())
	assert.Positive(t, l.sources[outcome.SourceFallback].Load(), "the failure policy decided")
	assert.Zero(t, l.total(), "outcome.FailClosed admitted nothing")
	assert.True(t, opened, "the breaker opened")
}
