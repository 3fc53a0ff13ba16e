package central

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/lua"
)

// forEachBackend runs fn on miniredis and on a real redis-server, because gopher-lua is not Redis's Lua.
func forEachBackend(t *testing.T, fn func(t *testing.T, rdb redis.UniversalClient)) {
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		fn(t, rdb)
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		fn(t, srv.Client(t))
	})
}

func testConfig(rdb redis.UniversalClient, node string) Config {
	return Config{
		Client: rdb, Prefix: "t", NodeID: node,
		SyncTimeout: time.Second, FlushTimeout: 2 * time.Second, MaxBatch: 100,
		ActiveWindow: 2 * time.Second, PruneAge: time.Minute,
		Breaker: BreakerConfig{Threshold: 3, Cooldown: 50 * time.Millisecond},
	}
}

func newTestClient(t *testing.T, rdb redis.UniversalClient, node string) *Client {
	t.Helper()
	c, err := New(testConfig(rdb, node))
	require.NoError(t, err)
	return c
}

// at pins the scripts' clock to us microseconds (test-only override of Redis TIME).
func (c *Client) at(us int64) { c.keyArgs[3] = us }

const t0 = int64(1763771234567891) // a 16-digit microsecond timestamp: real Redis's tostring would round it

func take(t *testing.T, c *Client, key string, lim Limit, inc uint64, cum, acked, n int64) State {
	t.Helper()
	st, err := c.Take(context.Background(), Update{Key: key, Limit: lim, Inc: inc, Cum: cum, Acked: acked, N: n, TakeID: c.NextTakeID()})
	require.NoError(t, err)
	return st
}

func TestScriptBucketScenarios(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		c := newTestClient(t, rdb, "a")
		lim := Limit{Rate: 0.5, Burst: 10}
		key := "k"
		rk := BucketKey("t", key)
		type step struct {
			at      int64 // µs after t0
			cum, n  int64
			taken   int8
			tokens  int64 // micro-tokens after the step
			applied int64
			retry   time.Duration
		}
		steps := []step{
			{at: 0, cum: 0, n: 4, taken: 1, tokens: 6_000_000, applied: 4},
			{at: 0, cum: 4, n: 7, taken: 0, tokens: 6_000_000, applied: 4, retry: 2 * time.Second}, // (7-6)/0.5
			// 1.5 s later: refill 0.75, then the 6 tokens consumed locally (cum 10 - applied 4) are applied,
			// leaving 0.75, which cannot cover n=1: retry after (1-0.75)/0.5 s.
			{at: 1_500_000, cum: 10, n: 1, taken: 0, tokens: 750_000, applied: 10, retry: 500 * time.Millisecond},
			{at: 3_000_000, cum: 10, n: 1, taken: 1, tokens: 500_000, applied: 11},      // refill 0.75 → 1.5, take 1
			{at: 2_000_000, cum: 11, n: 0, taken: -1, tokens: 500_000, applied: 11},     // clock went back: no refill
			{at: 22_000_000, cum: 11, n: 0, taken: -1, tokens: 10_000_000, applied: 11}, // capped at burst
		}
		acked := int64(0)
		for i, s := range steps {
			c.at(t0 + s.at)
			st := take(t, c, key, lim, 1, s.cum, acked, s.n)
			assert.Equal(t, s.taken, st.Taken, "step %d taken", i)
			assert.Equal(t, s.tokens, st.Tokens, "step %d tokens", i)
			assert.Equal(t, s.applied, st.Applied, "step %d applied", i)
			assert.Equal(t, s.retry, st.RetryAfter, "step %d retry", i)
			acked = min(st.Applied, s.cum)
		}
		// The refill timestamp survives the round trip with all 16 digits (tostring would keep 14).
		ts, err := rdb.HGet(ctx, rk, "ts").Result()
		require.NoError(t, err)
		assert.Equal(t, strconv.FormatInt(t0+22_000_000, 10), ts, "ts must not be rounded")
		c.at(0)
		// The TTL is twice the time to refill plus a second: 2·10/0.5 s + 1 s = 41 s.
		ttl, err := rdb.PTTL(ctx, rk).Result()
		require.NoError(t, err)
		assert.InDelta(t, 41*time.Second, ttl, float64(2*time.Second))
	})
}

func TestScriptFractionalTokensSurvive(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestClient(t, rdb, "a")
		lim := Limit{Rate: 1.0 / 3, Burst: 5}
		c.at(t0)
		take(t, c, "f", lim, 1, 0, 0, 5)
		// 1 µs at a third of a token per second: 3.33e-7 tokens, kept (and summed) exactly enough that a
		// million such refills add up to a third of a token.
		var st State
		for i := int64(1); i <= 4; i++ {
			c.at(t0 + i*250_000)
			st = take(t, c, "f", lim, 1, 5, 5, 0)
		}
		assert.Equal(t, int64(333_333), st.Tokens, "1s at 1/3 token/s in four steps")
		tk, err := rdb.HGet(context.Background(), BucketKey("t", "f"), "tk").Float64()
		require.NoError(t, err)
		assert.InDelta(t, 1.0/3, tk, 1e-12, "stored tokens keep 17 significant digits")
	})
}

func TestScriptDebtFloorAndRetry(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestClient(t, rdb, "a")
		lim := Limit{Rate: 10, Burst: 20}
		c.at(t0)
		// The node consumed 70 locally (overshoot): the bucket goes into debt, floored at -burst.
		st := take(t, c, "d", lim, 1, 70, 0, 0)
		assert.Equal(t, int64(-20_000_000), st.Tokens)
		assert.Equal(t, int64(70), st.Applied)
		st = take(t, c, "d", lim, 1, 70, 70, 5)
		assert.Equal(t, int8(0), st.Taken)
		assert.Equal(t, 2500*time.Millisecond, st.RetryAfter, "(5 - -20) / 10 per second")
		assert.Equal(t, 4*time.Second, st.ResetAfter, "(20 - -20) / 10")
		consumed, err := rdb.HGet(context.Background(), BucketKey("t", "d"), "c").Int64()
		require.NoError(t, err)
		assert.Equal(t, int64(70), consumed, "accounting keeps every consumed token")
	})
}

func TestScriptIsIdempotent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		c := newTestClient(t, rdb, "a")
		lim := Limit{Rate: 1, Burst: 100}
		c.at(t0)
		u := Update{Key: "i", Limit: lim, Inc: 1, Cum: 30}
		for range 3 { // a re-sent reconcile is applied once
			out, errs := make([]State, 1), make([]error, 1)
			require.NoError(t, c.Reconcile(ctx, []Update{u}, out, errs))
			assert.Equal(t, int64(70_000_000), out[0].Tokens)
		}
		// A replayed take returns its verdict without taking again.
		tu := Update{Key: "i", Limit: lim, Inc: 1, Cum: 30, Acked: 30, N: 10, TakeID: 77}
		for range 2 {
			st, err := c.Take(ctx, tu)
			require.NoError(t, err)
			assert.Equal(t, int8(1), st.Taken)
			assert.Equal(t, int64(40), st.Applied)
			assert.Equal(t, int64(60_000_000), st.Tokens)
		}
		consumed, err := rdb.HGet(ctx, BucketKey("t", "i"), "c").Int64()
		require.NoError(t, err)
		assert.Equal(t, int64(40), consumed)
	})
}

func TestScriptIncarnations(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestClient(t, rdb, "a")
		lim := Limit{Rate: 1, Burst: 100}
		c.at(t0)
		take(t, c, "n", lim, 1, 30, 0, 0)
		// The node evicted the key (clean) and starts a new incarnation at 0.
		st := take(t, c, "n", lim, 2, 5, 0, 0)
		assert.Equal(t, int64(65_000_000), st.Tokens, "new incarnation's 5 applied on top of the old 30")
		// A late message from incarnation 1 changes nothing.
		st = take(t, c, "n", lim, 1, 50, 30, 0)
		assert.Equal(t, int64(65_000_000), st.Tokens)
		// After the key expired in Redis, a node's acked seeds what was applied.
		require.NoError(t, rdb.Del(context.Background(), BucketKey("t", "n")).Err())
		st = take(t, c, "n", lim, 2, 8, 5, 0)
		assert.Equal(t, int64(97_000_000), st.Tokens, "only cum - acked = 3 applied to a fresh bucket")
	})
}

func TestScriptCountsActiveNodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		lim := Limit{Rate: 1, Burst: 100}
		var st State
		for i, node := range []string{"a", "b", "c"} {
			c := newTestClient(t, rdb, node)
			c.at(t0 + int64(i))
			st = take(t, c, "act", lim, 1, 1, 0, 0)
		}
		assert.Equal(t, int64(3), st.Active)
		// Long after, one node comes back: the recount prunes nothing yet (prune age 1m) but counts 1 active.
		c := newTestClient(t, rdb, "a")
		c.at(t0 + 10_000_000)
		st = take(t, c, "act", lim, 1, 2, 1, 0)
		assert.Equal(t, int64(1), st.Active)
		// After the prune age the departed nodes' records are deleted.
		c.at(t0 + 200_000_000)
		take(t, c, "act", lim, 1, 3, 2, 0)
		fields, err := rdb.HKeys(context.Background(), BucketKey("t", "act")).Result()
		require.NoError(t, err)
		var nodes []string
		for _, f := range fields {
			if strings.HasPrefix(f, "n:") {
				nodes = append(nodes, f)
			}
		}
		assert.Equal(t, []string{"n:a"}, nodes)
	})
}

func TestScriptRejectsBadNumbers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		src := redis.NewScript(lua.StripShebang(lua.Reconcile()))
		for _, tc := range []struct {
			name string
			args []any // inc, cum, acked, n, take, rate, burst
		}{
			{"nan rate", []any{1, 0, 0, 1, 1, "nan", 10}},
			{"inf rate", []any{1, 0, 0, 1, 1, "inf", 10}},
			{"negative rate", []any{1, 0, 0, 1, 1, "-1", 10}},
			{"zero burst", []any{1, 0, 0, 1, 1, "1", 0}},
			{"fractional burst", []any{1, 0, 0, 1, 1, "1", 2.5}},
			{"n over burst", []any{1, 0, 0, 11, 1, "1", 10}},
			{"nan cum", []any{1, "nan", 0, 1, 1, "1", 10}},
			{"acked over cum", []any{1, 1, 2, 1, 1, "1", 10}},
			{"garbage n", []any{1, 0, 0, "x", 1, "1", 10}},
		} {
			args := append([]any{"node", 1000, 60000, 0}, tc.args...)
			err := src.Eval(ctx, rdb, []string{"t:v1:{bad}"}, args...).Err()
			require.Error(t, err, tc.name)
			assert.Contains(t, err.Error(), "hybridrate: bad", tc.name)
		}
		n, err := rdb.Exists(ctx, "t:v1:{bad}").Result()
		require.NoError(t, err)
		assert.Equal(t, int64(0), n, "a rejected call writes nothing")
		// Go rejects them before they are sent.
		c := newTestClient(t, rdb, "a")
		for _, lim := range []Limit{{math.NaN(), 1}, {math.Inf(1), 1}, {-1, 1}, {1, 0}} {
			_, err := c.Take(ctx, Update{Key: "x", Limit: lim, N: 1})
			assert.Error(t, err)
			assert.False(t, IsTransport(err))
		}
	})
}

func TestNoScriptRecovery(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		c := newTestClient(t, rdb, "a")
		lim := Limit{Rate: 1, Burst: 100}
		take(t, c, "s", lim, 1, 0, 0, 1)
		applied := int64(1)
		for round := 0; round < 2; round++ {
			require.NoError(t, rdb.ScriptFlush(ctx).Err())
			loads := c.Stats().ScriptLoads.Load()
			ups := []Update{{Key: "s", Limit: lim, Inc: 1, Cum: applied + 1, Acked: applied}}
			out, errs := make([]State, 1), make([]error, 1)
			require.NoError(t, c.Reconcile(ctx, ups, out, errs), "pipelined reconcile after SCRIPT FLUSH")
			require.NoError(t, errs[0])
			assert.Equal(t, applied+1, out[0].Applied)
			applied = out[0].Applied
			assert.Greater(t, c.Stats().ScriptLoads.Load(), loads, "the script was reloaded")
			require.NoError(t, rdb.ScriptFlush(ctx).Err())
			st := take(t, c, "s", lim, 1, applied, applied, 1)
			assert.Equal(t, int8(1), st.Taken, "take after SCRIPT FLUSH")
			applied = st.Applied
		}
	})
}

func TestReconcileBatchesManyKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		c := newTestClient(t, rdb, "a")
		const n = 250 // three script calls of at most 100 keys
		ups := make([]Update, n)
		for i := range ups {
			ups[i] = Update{Key: "b" + strconv.Itoa(i), Limit: Limit{Rate: 100, Burst: 1000}, Inc: 1, Cum: int64(i)}
		}
		ups[7].Limit.Rate = math.NaN() // one bad update fails alone
		out, errs := make([]State, n), make([]error, n)
		err := c.Reconcile(ctx, ups, out, errs)
		require.Error(t, err)
		for i := range ups {
			if i == 7 {
				assert.Error(t, errs[i])
				continue
			}
			require.NoError(t, errs[i], i)
			assert.Equal(t, int64(i), out[i].Applied, i)
			assert.Equal(t, (1000-int64(i))*1_000_000, out[i].Tokens, i)
		}
	})
}

func TestBreakerOpensAndFailsFast(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	c := newTestClient(t, rdb, "a")
	ctx := context.Background()
	take(t, c, "br", Limit{Rate: 1, Burst: 10}, 1, 0, 0, 1)
	srv.Kill(t)
	for i := 0; i < 3; i++ {
		_, err := c.Take(ctx, Update{Key: "br", Limit: Limit{Rate: 1, Burst: 10}, Inc: 1, Cum: 1, Acked: 1, N: 1, TakeID: c.NextTakeID()})
		require.Error(t, err)
		assert.True(t, IsTransport(err), "%v", err)
	}
	assert.Equal(t, BreakerOpen, c.Breaker().State())
	start := time.Now()
	_, err := c.Take(ctx, Update{Key: "br", Limit: Limit{Rate: 1, Burst: 10}, Inc: 1, Cum: 1, Acked: 1, N: 1})
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.Less(t, time.Since(start), 10*time.Millisecond, "an open breaker does no I/O")
	srv.Restart(t)
	require.Eventually(t, func() bool {
		_, err := c.Take(ctx, Update{Key: "br", Limit: Limit{Rate: 1, Burst: 10}, Inc: 1, Cum: 1, Acked: 1, N: 1, TakeID: c.NextTakeID()})
		return err == nil
	}, 5*time.Second, 20*time.Millisecond)
	assert.Equal(t, BreakerClosed, c.Breaker().State())
}

func TestKeysAndSlots(t *testing.T) {
	assert.Equal(t, "hr:v1:{user:1}", BucketKey("hr", "user:1"))
	assert.Equal(t, uint16(0x31C3), crc16("123456789"), "CRC-16/XMODEM check value")
	assert.Equal(t, Slot("bar"), Slot("x{bar}y"))
	assert.Equal(t, Slot("a{}b"), int(crc16("a{}b")&16383), "empty tag hashes the whole key")
	assert.NotEqual(t, BucketKey("hr", "a}b"), BucketKey("hr", "a"), "different keys stay different")
	for _, p := range []string{"", "a{", "b}", "c d"} {
		assert.False(t, validPrefix(p), p)
	}
}

// TestExtremeRatesReachTheScript pins the rate's wire format: no exponent ("1e+09" is not a number
// to gopher-lua) and all digits of a fractional rate.
func TestExtremeRatesReachTheScript(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestClient(t, rdb, "a")
		for i, lim := range []Limit{{1e9, 1e9}, {1e-6, 1}, {123.456789, 7}, {1.0 / 3, 1}} {
			c.at(t0)
			st := take(t, c, "rate"+strconv.Itoa(i), lim, 1, 0, 0, 1)
			assert.Equal(t, int8(1), st.Taken, "%v", lim)
			assert.Equal(t, (lim.Burst-1)*1_000_000, st.Tokens, "%v", lim)
			c.at(t0 + 1_000_000)
			st = take(t, c, "rate"+strconv.Itoa(i), lim, 1, 1, 1, 0)
			want := float64(lim.Burst-1)*1e6 + lim.Rate*1e6
			assert.InDelta(t, math.Min(want, float64(lim.Burst)*1e6), float64(st.Tokens), 1, "%v: one second of refill", lim)
		}
	})
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
