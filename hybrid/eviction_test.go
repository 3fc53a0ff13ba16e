package hybrid_test

import (
	"log/slog"
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
		rdb := srv.Client(t, func(o *redis.Options) { o.Username, o.Password, o.MaxRetries = tc.user, "pw", -1 })
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
