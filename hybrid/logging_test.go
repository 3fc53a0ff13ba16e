package hybrid_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/logtest"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// TestOutageLogsStateChanges is issue 11 item 5: Redis killed for 2s under load at a 1ms sync
// interval costs a handful of log lines (the breaker opened, with its cause; a summary of the
// failed reconciles; the breaker closed), not one line per flush.
func TestOutageLogsStateChanges(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, redistest.NoRetries)
	rec := &logtest.Recorder{}
	// Strict mode (drift 0): every decision asks Redis, so the outage meets the synchronous checks
	// and the breaker at once; the failure policy's admissions are reconciled every millisecond.
	lim := newLimiter(t, rdb, hybrid.WithSyncInterval(time.Millisecond), hybrid.WithLogger(slog.New(rec)),
		hybrid.WithDriftThreshold(0), hybrid.WithCheckTimeout(20*time.Millisecond), hybrid.WithFlushTimeout(50*time.Millisecond))
	keys := keyNames("log:", 32)
	limit := hybrid.Limit{Rate: 1e4, Burst: 1e6}
	for _, k := range keys {
		d, err := lim.Decide(context.Background(), k, limit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	flushed(t, lim, 5*time.Second)
	l := &loader{lim: lim, keys: keys, limit: limit, pace: 100 * time.Microsecond}
	l.start(2)
	defer l.halt()
	time.Sleep(100 * time.Millisecond)
	from := rec.Len()

	srv.Kill(t)
	time.Sleep(2 * time.Second)
	flushesDuring := lim.Stats().Flushes
	srv.Restart(t)
	require.Eventually(t, func() bool { return !lim.Stats().BreakerOpen && lim.Stats().FailedKeys > 0 },
		5*time.Second, 10*time.Millisecond, "the breaker closes once Redis is back")
	time.Sleep(100 * time.Millisecond)

	lines := rec.Lines(from)
	t.Logf("%d log lines during a 2s outage (%d flush rounds so far):\n%s", len(lines), flushesDuring, strings.Join(lines, "\n"))
	assert.LessOrEqual(t, len(lines), 8, "a handful of lines, not one per flush")
	assert.Positive(t, count(lines, "circuit breaker opened", "class=transport", "last_error="), "the opening, with its cause")
	assert.Positive(t, count(lines, "reconcile failing", "failures="), "a summary of the failed reconciles")
	assert.Positive(t, count(lines, "circuit breaker closed"), "the recovery")
}

// count returns how many of lines contain every one of sub.
func count(lines []string, sub ...string) int {
	n := 0
	for _, line := range lines {
		ok := true
		for _, s := range sub {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			n++
		}
	}
	return n
}

// policyLines returns the log lines about the maxmemory-policy.
func policyLines(rec *logtest.Recorder) []string {
	var out []string
	for _, line := range rec.Lines(0) {
		if strings.Contains(line, "maxmemory-policy") {
			out = append(out, line)
		}
	}
	return out
}

// TestEvictionPolicyWarning is issue 11 item 6: a maxmemory-policy that can evict the limiter's keys
// is detected at start and when it changes, warned about once per change, and shown in Stats (and
// the hybridrate.redis.eviction_policy_unsafe gauge, observed from Stats).
func TestEvictionPolicyWarning(t *testing.T) {
	srv := redistest.Start(t)
	rec := &logtest.Recorder{}
	gauges := newGaugeReader()
	lim := newLimiter(t, srv.Client(t), hybrid.WithLogger(slog.New(rec)), hybrid.WithEvictionCheckInterval(20*time.Millisecond),
		hybrid.WithMeterProvider(gauges))
	policy := func(want string, unsafe bool) {
		t.Helper()
		require.Eventually(t, func() bool { return lim.Stats().EvictionPolicy == want }, 5*time.Second, 5*time.Millisecond, "policy %s seen", want)
		assert.Equal(t, unsafe, lim.Stats().EvictionUnsafe, want)
		g := gauges.read()
		v, ok := g["hybridrate.redis.eviction_policy_unsafe{policy="+want+"}"]
		assert.True(t, ok, "gauge observed: %v", g)
		assert.Equal(t, map[bool]int64{false: 0, true: 1}[unsafe], v, "gauge for %s", want)
		time.Sleep(100 * time.Millisecond) // five more checks: no more lines
	}
	policy("noeviction", false)
	assert.Empty(t, policyLines(rec), "nothing to say about noeviction")

	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	policy("allkeys-lru", true)
	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "volatile-lru")
	policy("volatile-lru", true)
	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	policy("noeviction", false)

	lines := policyLines(rec)
	t.Logf("log:\n%s", strings.Join(lines, "\n"))
	assert.Equal(t, 1, count(lines, "WARN", "can evict the limiter's keys", "maxmemory_policy=allkeys-lru"))
	assert.Equal(t, 1, count(lines, "WARN", "can evict the limiter's keys", "maxmemory_policy=volatile-lru"))
	assert.Equal(t, 1, count(lines, "INFO", "noeviction again"))
	assert.Len(t, lines, 3)
}

// TestEvictionPolicyWithoutConfig: a user without CONFIG reads the policy from INFO memory; a user
// with neither gets one line saying the policy cannot be checked.
func TestEvictionPolicyWithoutConfig(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lfu")
	srv.Do(t, append(append([]any{"ACL", "SETUSER", "info"}, limiterACL...), "+info")...)
	srv.Do(t, append([]any{"ACL", "SETUSER", "lim"}, limiterACL...)...)
	for _, tc := range []struct{ user, want string }{{"info", "allkeys-lfu"}, {"lim", ""}} {
		rec := &logtest.Recorder{}
		rdb := srv.Client(t, redistest.As(tc.user, "pw"))
		lim := newLimiter(t, rdb, hybrid.WithLogger(slog.New(rec)), hybrid.WithEvictionCheckInterval(20*time.Millisecond))
		require.Eventually(t, func() bool { return len(policyLines(rec)) > 0 }, 5*time.Second, 5*time.Millisecond)
		time.Sleep(100 * time.Millisecond)
		lines := policyLines(rec)
		t.Logf("user %s:\n%s", tc.user, strings.Join(lines, "\n"))
		require.Len(t, lines, 1, "once, not per check")
		assert.Equal(t, tc.want, lim.Stats().EvictionPolicy)
		if tc.want != "" {
			assert.True(t, lim.Stats().EvictionUnsafe)
			assert.Contains(t, lines[0], "maxmemory_policy=allkeys-lfu")
		} else {
			assert.Contains(t, lines[0], "cannot read Redis's maxmemory-policy")
			assert.Contains(t, lines[0], "NOPERM")
		}
	}
}

// TestRedisLogRateLimits: a RedisLog writes the first line, then at most one per interval, each
// counting the lines it stands for.
func TestRedisLogRateLimits(t *testing.T) {
	t.Parallel()
	rec := &logtest.Recorder{}
	rl := hybrid.NewRedisLog(slog.New(rec), 10*time.Second)
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	now := t0
	rl.SetClock(func() time.Time { return now })
	for i, step := range []struct {
		at      time.Duration
		written string // the line written, or ""
	}{
		{0, "WARN hybridrate: go-redis: line 0 lines=1"},
		{time.Second, ""},
		{5 * time.Second, ""},
		{10 * time.Second, "WARN hybridrate: go-redis: line 3 lines=3"},
		{19 * time.Second, ""},
		{25 * time.Second, "WARN hybridrate: go-redis: line 5 lines=2"},
	} {
		now = t0.Add(step.at)
		before := rec.Len()
		rl.Printf(context.Background(), "line %d", i)
		lines := rec.Lines(before)
		if step.written == "" {
			assert.Empty(t, lines, "step %d", i)
		} else {
			assert.Equal(t, []string{step.written}, lines, "step %d", i)
		}
	}
}

// stderrLog is go-redis's default logger, restored after a test that replaced it.
type stderrLog struct{ l *log.Logger }

func (s stderrLog) Printf(_ context.Context, format string, v ...any) {
	_ = s.l.Output(2, fmt.Sprintf(format, v...))
}

// TestRedisLogRoutesGoRedisLines (issue 26): installed with redis.SetLogger, a RedisLog receives
// go-redis's "failed to dial" lines of a client whose Redis is down, and writes one line for many.
// Not parallel: go-redis's logger is process-wide.
func TestRedisLogRoutesGoRedisLines(t *testing.T) {
	t.Cleanup(func() { redistest.AwaitDialRetries(t) }) // registered first: runs after the clients are closed
	srv := redistest.Start(t)
	srv.Kill(t) // a port nothing listens on
	rec := &logtest.Recorder{}
	redis.SetLogger(hybrid.NewRedisLog(slog.New(rec), time.Hour))
	t.Cleanup(func() { redis.SetLogger(stderrLog{log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)}) })
	rdb := srv.Client(t, redistest.NoRetries)
	for range 4 {
		require.Error(t, rdb.Ping(context.Background()).Err())
	}
	lines := rec.Lines(0)
	t.Logf("%d line(s) for 4 failed dials: %s", len(lines), strings.Join(lines, "\n"))
	require.Len(t, lines, 1, "one line for the whole burst")
	assert.Contains(t, lines[0], "hybridrate: go-redis:")
	assert.Contains(t, lines[0], "dial")
}
