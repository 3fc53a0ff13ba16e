package strict

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/internal/redisx"
)

// strictT0 is the pinned script clock of the tests, in µs: a multiple of one minute, so windows of a
// minute (or a divisor of it) start at strictT0, and 16 digits long, so a tostring would round it.
//
// The scenarios use periods of 10s: Redis expires keys on its real clock while the script clock is
// pinned, so every TTL a scenario sets must outlast the scenario, even in a slow -race run.
const strictT0 = int64(1763771220000000)

// newTestStrict returns a limiter with the tests' settings (prefix "t", a timeout of 2s, a breaker
// of 3 failures and 50ms), then opts.
func newTestStrict(t testing.TB, rdb redis.UniversalClient, opts ...Option) *Limiter {
	t.Helper()
	s, err := New(rdb, append([]Option{WithKeyPrefix("t"), WithTimeout(2 * time.Second),
		WithBreaker(3, 50*time.Millisecond, 0)}, opts...)...)
	require.NoError(t, err)
	return s
}

// forEachStrict runs fn on every backend (redistest.ForEachBackend) with a limiter from
// newTestStrict over its client.
func forEachStrict(t *testing.T, fn func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, s *Limiter)) {
	t.Helper()
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) {
		fn(t, context.Background(), rdb, newTestStrict(t, rdb))
	})
}

// at pins the scripts' clock to strictT0 + offset µs (the test-only override of Redis TIME).
func (l *Limiter) at(offset int64) { l.clock.Store(strictT0 + offset) }

// strictStep is one request of a scenario and the answer it must get.
type strictStep struct {
	at        int64 // µs after strictT0
	n         int64
	allowed   bool
	remaining int64
	retry     time.Duration
	reset     time.Duration
	excess    int64 // UpstreamWindow only
}

// Short names for the tables.
const (
	us = time.Microsecond
	ms = time.Millisecond
)

func runStrictSteps(t *testing.T, s *Limiter, rule Rule, subject string, steps []strictStep) {
	t.Helper()
	for i, st := range steps {
		s.at(st.at)
		got, err := s.DecideN(context.Background(), rule, subject, st.n)
		require.NoError(t, err, "step %d", i)
		want := Decision{Allowed: st.allowed, Limit: rule.Limit, Remaining: st.remaining, RetryAfter: st.retry, ResetAfter: st.reset, Excess: st.excess}
		assert.Equal(t, want, got, "step %d: n=%d at +%dµs", i, st.n, st.at)
	}
}

// assertPTTL checks that key expires in about want (the TTL was set from the pinned clock; real time
// has moved on by the test's duration since).
func assertStrictPTTL(t *testing.T, rdb redis.UniversalClient, key string, want time.Duration) {
	t.Helper()
	got, err := rdb.PTTL(context.Background(), key).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, got, want, "TTL of %s", key)
	assert.Greater(t, got, want-200*time.Millisecond, "TTL of %s", key)
}

// assertStrictState checks the state a scenario left under key: a hash's fields (want is a
// map[string]string) or a string's value (want is a string), and, for a non-zero ttl, its expiry
// (see assertStrictPTTL).
func assertStrictState(t *testing.T, rdb redis.UniversalClient, key string, want any, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	var got any
	var err error
	switch want.(type) {
	case map[string]string:
		got, err = rdb.HGetAll(ctx, key).Result()
	case string:
		got, err = rdb.Get(ctx, key).Result()
	default:
		t.Fatalf("state of %s: want %T, not a hash or a string", key, want)
	}
	require.NoError(t, err)
	assert.Equal(t, want, got, "state of %s", key)
	if ttl != 0 {
		assertStrictPTTL(t, rdb, key, ttl)
	}
}

// A token bucket and GCRA with the same limit and period give the same answers; only the state differs.
var strictBucketSteps = []strictStep{ // limit 10 per 10s: one token per second
	{at: 0, n: 1, allowed: true, remaining: 9, reset: time.Second},                                         // first request
	{at: 0, n: 9, allowed: true, remaining: 0, reset: 10 * time.Second},                                    // at the limit (weighted)
	{at: 0, n: 1, allowed: false, remaining: 0, retry: time.Second, reset: 10 * time.Second},               // over it
	{at: 999_999, n: 1, allowed: false, remaining: 0, retry: us, reset: 9_000_001 * us},                    // 1µs short
	{at: 1_000_000, n: 1, allowed: true, remaining: 0, reset: 10 * time.Second},                            // exactly at retry-after
	{at: 3_500_000, n: 3, allowed: false, remaining: 2, retry: 500 * ms, reset: 7500 * ms},                 // 2.5 tokens
	{at: 4_000_000, n: 3, allowed: true, remaining: 0, reset: 10 * time.Second},                            // weighted, at retry-after
	{at: 50_000_000, n: 10, allowed: true, remaining: 0, reset: 10 * time.Second},                          // refilled, capped at 10
	{at: 40_000_000, n: 1, allowed: false, remaining: 0, retry: 11 * time.Second, reset: 20 * time.Second}, // clock went back 10s
	{at: 51_000_000, n: 1, allowed: true, remaining: 0, reset: 10 * time.Second},
}

// TestStrictScenarios runs each algorithm's scenario (limit 10 per 10s for "alice"), then checks
// the state it leaves in Redis: a hash's fields or a string, and the key's TTL.
func TestStrictScenarios(t *testing.T) {
	sec := time.Second
	for _, c := range []struct {
		name      string
		algorithm Algorithm
		steps     []strictStep
		suffix    string        // of the state's key, "t:v1:{alice}:api:<suffix>"
		state     any           // a hash's fields (map[string]string) or a string's value
		ttl       time.Duration // of the state's key
	}{
		// ts keeps all 16 digits; the TTL is the time to full refill, rounded up, +1ms.
		{"token bucket", TokenBucket, strictBucketSteps, "tb",
			map[string]string{"tk": "0", "ts": strconv.FormatInt(strictT0+51_000_000, 10)}, 10_001 * ms},
		// One string: ts and TAT−ts.
		{"GCRA", GCRA, strictBucketSteps, "gcra", strconv.FormatInt(strictT0+51_000_000, 10) + " 10000000", 10_001 * ms},
		// The TTL was set when the window's count started, at +25s: until its end.
		{"fixed window", FixedWindow, []strictStep{
			{at: 0, n: 1, allowed: true, remaining: 9, reset: 10 * sec},
			{at: 5_000_000, n: 9, allowed: true, remaining: 0, reset: 5 * sec},
			{at: 5_000_000, n: 1, allowed: false, remaining: 0, retry: 5 * sec, reset: 5 * sec},
			{at: 9_999_999, n: 1, allowed: false, remaining: 0, retry: us, reset: us},
			{at: 10_000_000, n: 10, allowed: true, remaining: 0, reset: 10 * sec}, // the next window
			{at: 12_000_000, n: 1, allowed: false, remaining: 0, retry: 8 * sec, reset: 8 * sec},
			{at: 25_000_000, n: 4, allowed: true, remaining: 6, reset: 5 * sec},
			{at: 26_000_000, n: 7, allowed: false, remaining: 6, retry: 4 * sec, reset: 4 * sec},
			{at: 26_000_000, n: 6, allowed: true, remaining: 0, reset: 4 * sec},
			{at: 15_000_000, n: 1, allowed: false, remaining: 0, retry: 15 * sec, reset: 15 * sec}, // clock went back
		}, "fw", map[string]string{"w": strconv.FormatInt(strictT0+20_000_000, 10), "c": "10"}, 5001 * ms},
		// The TTL lasts until the end of the next window.
		{"sliding window", SlidingWindow, []strictStep{
			{at: 0, n: 10, allowed: true, remaining: 0, reset: 20 * sec},
			// Not in this window; in the next one 10·(1 − e/10s) + 1 ≤ 10 from e = 1s.
			{at: 5_000_000, n: 1, allowed: false, remaining: 0, retry: 6 * sec, reset: 15 * sec},
			{at: 11_000_000, n: 1, allowed: true, remaining: 0, reset: 19 * sec}, // 9 + 1
			{at: 11_000_000, n: 1, allowed: false, remaining: 0, retry: sec, reset: 19 * sec},
			{at: 11_999_999, n: 1, allowed: false, remaining: 0, retry: us, reset: 18_000_001 * us},
			{at: 12_000_000, n: 1, allowed: true, remaining: 0, reset: 18 * sec},                      // 8 + 1 + 1
			{at: 14_500_000, n: 3, allowed: false, remaining: 2, retry: 500 * ms, reset: 15_500 * ms}, // 5.5 + 2 + 3
			{at: 15_000_000, n: 3, allowed: true, remaining: 0, reset: 15 * sec},                      // 5 + 2 + 3
			{at: 35_000_000, n: 10, allowed: true, remaining: 0, reset: 15 * sec},                     // two windows on: nothing weighs
		}, "sw", map[string]string{"w": strconv.FormatInt(strictT0+30_000_000, 10), "c": "10", "p": "0"}, 15_001 * ms},
	} {
		t.Run(c.name, func(t *testing.T) {
			redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) {
				s := newTestStrict(t, rdb)
				rule := Rule{Name: "api", Algorithm: c.algorithm, Limit: 10, Period: 10 * sec}
				runStrictSteps(t, s, rule, "alice", c.steps)
				assertStrictState(t, rdb, "t:v1:{alice}:api:"+c.suffix, c.state, c.ttl)
			})
		})
	}
}

func TestStrictGCRAFractionalInterval(t *testing.T) {
	// 3 per second: T = 333333.33…µs, which no µs timestamp can hold. The burst of 3 passes, the 4th
	// waits exactly one interval (rounded up to the µs), and a saturated run admits exactly the rate.
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) {
		s := newTestStrict(t, rdb)
		ctx := context.Background()
		for _, a := range []Algorithm{GCRA, TokenBucket} {
			rule := Rule{Name: "third", Algorithm: a, Limit: 3, Period: time.Second}
			s.at(0)
			for i := 0; i < 3; i++ {
				r, err := s.Decide(ctx, rule, "u")
				require.NoError(t, err)
				require.True(t, r.Allowed, "%v burst %d", a, i)
			}
			r, err := s.Decide(ctx, rule, "u")
			require.NoError(t, err)
			assert.Equal(t, 333_334*us, r.RetryAfter, "%v", a)
			// Ask again exactly at each retry-after, 60 times: the admissions land on the schedule.
			at, admitted := int64(0), 0
			for admitted < 60 {
				at += int64(r.RetryAfter / us)
				s.at(at)
				r, err = s.Decide(ctx, rule, "u")
				require.NoError(t, err)
				if r.Allowed {
					admitted++
					r.RetryAfter = time.Microsecond
				}
			}
			assert.InDelta(t, 20_000_000, at, 2, "%v: 60 more at 3/s take 20s, to the µs", a)
		}
	})
}

func TestStrictUpstreamWindow(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) {
		s := newTestStrict(t, rdb)
		rule := Rule{Name: "api", Algorithm: UpstreamWindow, Limit: 3, Period: 10 * time.Second}
		sec := time.Second
		runStrictSteps(t, s, rule, "alice", []strictStep{
			{at: 0, n: 0, allowed: true, remaining: 3, reset: 0}, // a read of an empty window writes nothing
			{at: 0, n: 2, allowed: true, remaining: 1, reset: 10 * sec},
			{at: 1_000_000, n: 2, allowed: false, remaining: 0, retry: 9 * sec, reset: 9 * sec, excess: 1},    // counted: 4
			{at: 1_000_000, n: 1, allowed: false, remaining: 0, retry: 9 * sec, reset: 9 * sec, excess: 2},    // 5, as upstream
			{at: 1_000_000, n: 0, allowed: false, remaining: 0, retry: 9 * sec, reset: 9 * sec, excess: 2},    // 5 > 3: over
			{at: 10_000_000, n: 7, allowed: false, remaining: 0, retry: 10 * sec, reset: 10 * sec, excess: 4}, // above the limit
			{at: 20_000_000, n: 3, allowed: true, remaining: 0, reset: 10 * sec},
			{at: 20_000_000, n: 0, allowed: true, remaining: 0, reset: 10 * sec}, // at the limit, not above: OK
		})
		s.at(21_000_000)
		r, err := s.DecideN(context.Background(), rule, "alice", 2)
		require.NoError(t, err)
		assert.Equal(t, Decision{Limit: 3, Excess: 2, RetryAfter: 9 * sec, ResetAfter: 9 * sec}, r, "5 counted, 2 above the limit")
		r, err = s.DecideN(context.Background(), rule, "alice", 0)
		require.NoError(t, err)
		assert.Equal(t, int64(2), r.Excess)
		assertStrictState(t, rdb, "t:v1:{alice}:api:uw", map[string]string{"w": strconv.FormatInt(strictT0+20_000_000, 10), "c": "5"}, 0)
	})
}

func TestStrictUpstreamWindowCountsWhenAnotherRuleRefuses(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) {
		s := newTestStrict(t, rdb)
		s.at(0)
		up := Rule{Name: "up", Algorithm: UpstreamWindow, Limit: 10, Period: 10 * time.Second}
		fw := Rule{Name: "fw", Algorithm: FixedWindow, Limit: 1, Period: 10 * time.Second}
		for i, want := range []bool{true, false} {
			m, err := s.AllowMulti(context.Background(), "alice", []Check{{Rule: up, Subject: "alice", N: 1}, {Rule: fw, Subject: "alice", N: 1}})
			require.NoError(t, err)
			assert.Equal(t, want, m.Allowed, "call %d", i)
			assert.Equal(t, int64(10-1-i), m.Decisions[0].Remaining, "call %d: the upstream window counts either way", i)
		}
	})
}

func TestStrictSlidingLog(t *testing.T) {
	forEachStrict(t, func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, s *Limiter) {
		rule := Rule{Name: "api", Algorithm: SlidingLog, Limit: 10, Period: 10 * time.Second}
		sec := time.Second
		runStrictSteps(t, s, rule, "alice", []strictStep{
			{at: 0, n: 4, allowed: true, remaining: 6, reset: 10 * sec},
			{at: 2_000_000, n: 5, allowed: true, remaining: 1, reset: 10 * sec},
			// 9 + 2 > 10: the 4 at +0 must leave first, at +10s.
			{at: 3_000_000, n: 2, allowed: false, remaining: 1, retry: 7 * sec, reset: 9 * sec},
			{at: 9_999_999, n: 2, allowed: false, remaining: 1, retry: us, reset: 2_000_001 * us},
			{at: 10_000_000, n: 2, allowed: true, remaining: 3, reset: 10 * sec},
			{at: 11_000_000, n: 4, allowed: false, remaining: 3, retry: sec, reset: 9 * sec},
			{at: 12_000_000, n: 4, allowed: true, remaining: 4, reset: 10 * sec},
		})
		// One member per request, not per unit, and the running sum of their costs.
		z, h := "t:v1:{alice}:api:sl", "t:v1:{alice}:api:sls"
		members, err := rdb.ZRangeWithScores(ctx, z, 0, -1).Result()
		require.NoError(t, err)
		assert.Equal(t, []redis.Z{
			{Score: float64(strictT0 + 10_000_000), Member: "3:2"},
			{Score: float64(strictT0 + 12_000_000), Member: "4:4"},
		}, members)
		assertStrictState(t, rdb, h, map[string]string{"s": "6", "q": "4"}, 10_001*ms)
		assertStrictPTTL(t, rdb, z, 10_001*ms)
	})
}

func TestStrictSlidingLogRecoversLostSum(t *testing.T) {
	forEachStrict(t, func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, s *Limiter) {
		rule := Rule{Name: "api", Algorithm: SlidingLog, Limit: 10, Period: time.Second}
		s.at(0)
		for _, n := range []int64{3, 4} {
			_, err := s.AllowN(ctx, rule, "bob", n)
			require.NoError(t, err)
		}
		// The hash is lost (say, evicted) but not the log: the sum and the sequence are rebuilt from it.
		require.NoError(t, rdb.Del(ctx, "t:v1:{bob}:api:sls").Err())
		r, err := s.DecideN(ctx, rule, "bob", 4)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "3 + 4 + 4 > 10")
		r, err = s.DecideN(ctx, rule, "bob", 3)
		require.NoError(t, err)
		assert.Equal(t, Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: time.Second}, r)
		n, err := rdb.ZCard(ctx, "t:v1:{bob}:api:sl").Result()
		require.NoError(t, err)
		assert.Equal(t, int64(3), n, "the new member did not overwrite an old one")
	})
}

func TestStrictShaper(t *testing.T) {
	forEachStrict(t, func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, s *Limiter) {
		sh, err := s.NewShaper(ShaperRule{Name: "jobs", Limit: 10, Period: 10 * time.Second, MaxWait: 10 * time.Second})
		require.NoError(t, err)
		sec := time.Second
		for i, st := range []struct {
			at   int64
			n    int64
			want *Reservation
		}{
			{0, 10, &Reservation{ok: true}},                        // the burst runs at once
			{0, 1, &Reservation{ok: true, delay: sec}},             // then one per second
			{0, 5, &Reservation{ok: true, delay: 6 * sec}},         // weighted
			{0, 5, &Reservation{ok: false, delay: 11 * sec}},       // beyond MaxWait: refused, books nothing
			{5_000_000, 5, &Reservation{ok: true, delay: 6 * sec}}, // the queue drained by 5s
			{5_000_000, 1, &Reservation{ok: true, delay: 7 * sec}},
		} {
			s.at(st.at)
			got, err := sh.ReserveN(ctx, "q", st.n)
			require.NoError(t, err, "step %d", i)
			assert.Equal(t, st.want, got, "step %d", i)
		}
		assertStrictPTTL(t, rdb, "t:v1:{q}:jobs:lb", 17_001*ms) // until the queue's TAT

		// WaitN sleeps for the delay; it books nothing when the deadline is too near.
		var slept []time.Duration
		s.sleep = func(_ context.Context, d time.Duration) error { slept = append(slept, d); return nil }
		s.at(10_000_000)
		require.NoError(t, sh.WaitN(ctx, "q", 1))
		assert.Equal(t, []time.Duration{3 * sec}, slept)
		dctx, cancel := context.WithTimeout(ctx, 2500*ms)
		defer cancel()
		err = sh.WaitN(dctx, "q", 1)
		assert.ErrorIs(t, err, ErrWaitTooLong)
		r, err := sh.Reserve(ctx, "q")
		require.NoError(t, err)
		assert.Equal(t, &Reservation{ok: true, delay: 4 * sec}, r, "the refused wait booked nothing")
	})
}

func TestStrictSleep(t *testing.T) {
	t.Parallel()
	start := time.Now()
	require.NoError(t, sleepCtx(context.Background(), 5*time.Millisecond))
	assert.GreaterOrEqual(t, time.Since(start), 5*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, sleepCtx(ctx, time.Hour), context.Canceled)
	assert.NoError(t, sleepCtx(context.Background(), 0))
}

// strictSnapshot reads every key of the database with its value, to compare states.
func strictSnapshot(t *testing.T, rdb redis.UniversalClient) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		typ, err := rdb.Type(ctx, k).Result()
		require.NoError(t, err)
		var v any
		switch typ {
		case "string":
			v, err = rdb.Get(ctx, k).Result()
		case "hash":
			v, err = rdb.HGetAll(ctx, k).Result()
		case "zset":
			v, err = rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		default:
			err = fmt.Errorf("unexpected type %s", typ)
		}
		require.NoError(t, err, k)
		out[k] = fmt.Sprint(v)
	}
	return out
}

func TestStrictMultiAllOrNothing(t *testing.T) {
	forEachStrict(t, func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, s *Limiter) {
		tenant := Rule{Name: "tenant", Algorithm: FixedWindow, Limit: 3, Period: time.Minute}
		checks := func(user string) []Check {
			return []Check{
				{Rule: Rule{Name: "user", Algorithm: TokenBucket, Limit: 5, Period: time.Minute}, Subject: user, N: 1},
				{Rule: Rule{Name: "user-g", Algorithm: GCRA, Limit: 5, Period: time.Minute}, Subject: user, N: 2},
				{Rule: Rule{Name: "user-s", Algorithm: SlidingWindow, Limit: 5, Period: time.Minute}, Subject: user, N: 1},
				{Rule: Rule{Name: "user-l", Algorithm: SlidingLog, Limit: 5, Period: time.Minute}, Subject: user, N: 1},
				{Rule: tenant, Subject: "acme", N: 1},
			}
		}
		s.at(0)
		for i, u := range []string{"u1", "u2", "u3"} {
			m, err := s.AllowMulti(ctx, "acme", checks(u))
			require.NoError(t, err)
			require.True(t, m.Allowed, "request %d", i)
			assert.Equal(t, int64(2-i), m.Decisions[4].Remaining, "tenant")
			assert.Equal(t, Decision{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 12 * time.Second}, m.Decisions[0])
		}
		before := strictSnapshot(t, rdb)
		require.Len(t, before, 3*5+1, "3 users × (4 keys + the log's hash) + the tenant")
		// u1 again: every user rule has room, the tenant has none: nothing is counted anywhere.
		s.at(10_000)
		m, err := s.AllowMulti(ctx, "acme", checks("u1"))
		require.NoError(t, err)
		assert.False(t, m.Allowed)
		left := time.Minute - 10*ms // the tenant's window started at strictT0
		assert.Equal(t, left, m.RetryAfter, "the tenant's window")
		for i, r := range m.Decisions[:4] {
			assert.True(t, r.Allowed, "rule %d had room", i)
			assert.Zero(t, r.RetryAfter, "rule %d", i)
		}
		assert.Equal(t, Decision{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 11_990 * ms}, m.Decisions[0],
			"u1's bucket had room and is shown as it stands, not charged")
		assert.Equal(t, Decision{Limit: 3, Remaining: 0, RetryAfter: left, ResetAfter: left}, m.Decisions[4])
		assert.Equal(t, before, strictSnapshot(t, rdb), "a denied call writes nothing")
		// A new user's keys are not even created.
		m, err = s.AllowMulti(ctx, "acme", checks("u9"))
		require.NoError(t, err)
		assert.False(t, m.Allowed)
		assert.Equal(t, before, strictSnapshot(t, rdb))
	})
}

func TestStrictMultiSameAlgorithm(t *testing.T) {
	forEachStrict(t, func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, s *Limiter) {
		perSec := Rule{Name: "sec", Algorithm: SlidingLog, Limit: 3, Period: time.Second}
		perMin := Rule{Name: "min", Algorithm: SlidingLog, Limit: 4, Period: time.Minute}
		s.at(0)
		var got []bool
		for i := 0; i < 6; i++ {
			s.at(int64(i) * 400_000) // 2.5 per second: under the per-second rule, over the per-minute one
			m, err := s.AllowMulti(ctx, "k", []Check{{Rule: perSec, Subject: "k", N: 1}, {Rule: perMin, Subject: "k", N: 1}})
			require.NoError(t, err)
			got = append(got, m.Allowed)
		}
		assert.Equal(t, []bool{true, true, true, true, false, false}, got)
		n, err := rdb.ZCard(ctx, "t:v1:{k}:sec:sl").Result()
		require.NoError(t, err)
		assert.Equal(t, int64(3), n, "the per-second log holds what both rules admitted in its last second")
	})
}

func TestStrictConcurrentExact(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.PoolSize = 64 })
	s := newTestStrict(t, rdb)
	s.at(0) // pinned: nothing refills and no window rolls over while the goroutines run
	const (
		limit      = 500
		goroutines = 64
		each       = 25 // 1600 requests for 500 units
	)
	sh, err := s.NewShaper(ShaperRule{Name: "shaper", Limit: limit, Period: time.Hour})
	require.NoError(t, err)
	type target struct {
		name string
		do   func(ctx context.Context) (bool, error)
	}
	var targets []target
	for _, a := range []Algorithm{TokenBucket, GCRA, FixedWindow, SlidingWindow, SlidingLog} {
		rule := Rule{Name: "c", Algorithm: a, Limit: limit, Period: time.Hour}
		targets = append(targets, target{a.String(), func(ctx context.Context) (bool, error) {
			r, err := s.DecideN(ctx, rule, "hot", 1)
			return r.Allowed, err
		}})
	}
	targets = append(targets, target{"shaper", func(ctx context.Context) (bool, error) {
		r, err := sh.Reserve(ctx, "hot")
		return r.OK(), err
	}})
	user := Rule{Name: "mu", Algorithm: TokenBucket, Limit: 700, Period: time.Hour}
	tenant := Rule{Name: "mt", Algorithm: SlidingWindow, Limit: limit, Period: time.Hour}
	targets = append(targets, target{"multi", func(ctx context.Context) (bool, error) {
		m, err := s.AllowMulti(ctx, "hot", []Check{{Rule: user, Subject: "u", N: 1}, {Rule: tenant, Subject: "hot", N: 1}})
		return m.Allowed, err
	}})
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			var admitted, failed atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						ok, err := tg.do(context.Background())
						if err != nil {
							failed.Add(1)
						} else if ok {
							admitted.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			assert.Zero(t, failed.Load())
			assert.Equal(t, int64(limit), admitted.Load())
		})
	}
	// The multi's user bucket was charged exactly for the admitted requests.
	tk, err := rdb.HGet(context.Background(), "t:v1:{hot}:mu:tb:u", "tk").Result()
	require.NoError(t, err)
	assert.Equal(t, "200", tk)
}

// TestStrictWindowBoundary shows each algorithm's behaviour around a window boundary: a subject silent
// for most of a minute sends a request every 30strictMS (far over 100 per minute) from 6s before the boundary
// to 6s after it. The fixed window admits 100 on each side (twice the limit within 12s); the sliding
// counter's weighted previous window keeps it near the limit; the log is exact; the token buckets admit
// their burst plus the refill of 12s. (A minute, not a second: the keys' TTLs run on real time while
// the script clock is pinned, and a slow -race run must not outlive them.)
func TestStrictWindowBoundary(t *testing.T) {
	const (
		boundary = 60_000_000 - strictT0%60_000_000 // µs from strictT0 to the next minute
		span     = 6_000_000
		step     = 30_000
	)
	// The buckets: 100 + 100/min · 11.97s (the last request is one step before the end) = 119.95.
	want := map[Algorithm]int{FixedWindow: 200, SlidingLog: 100, TokenBucket: 119, GCRA: 119}
	forEachStrict(t, func(t *testing.T, ctx context.Context, _ redis.UniversalClient, s *Limiter) {
		for _, a := range []Algorithm{FixedWindow, SlidingWindow, SlidingLog, TokenBucket, GCRA} {
			rule := Rule{Name: "edge", Algorithm: a, Limit: 100, Period: time.Minute}
			before, after := 0, 0
			for at := int64(boundary - span); at < boundary+span; at += step {
				s.at(at)
				r, err := s.Decide(ctx, rule, "burst")
				require.NoError(t, err)
				if r.Allowed && at < boundary {
					before++
				} else if r.Allowed {
					after++
				}
			}
			t.Logf("%-14v admitted %3d in the 6s before the boundary, %3d after: %3d within 12s (limit 100/min)",
				a, before, after, before+after)
			if a == SlidingWindow {
				assert.Equal(t, 100, before)
				assert.LessOrEqual(t, after, 10, "100·(1 − e/1min) + c ≤ 100 lets at most 10 through by e = 6s")
				assert.GreaterOrEqual(t, after, 9)
				continue
			}
			assert.Equal(t, want[a], before+after, "%v", a)
		}
	})
}

func TestStrictValidation(t *testing.T) {
	t.Parallel()
	m, rdb := redistest.Mini(t)
	s := newTestStrict(t, rdb)
	ctx := context.Background()
	ok := Rule{Name: "r", Algorithm: TokenBucket, Limit: 10, Period: time.Second}
	with := func(f func(*Rule)) Rule { r := ok; f(&r); return r }
	for _, tc := range []struct {
		name    string
		rule    Rule
		subject string
		n       int64
	}{
		{"empty subject", ok, "", 1},
		{"oversized subject", ok, strings.Repeat("x", MaxKeyLen+1), 1},
		{"subject with a closing brace", ok, "a}b", 1},
		{"zero n", ok, "s", 0},
		{"negative n", ok, "s", -1},
		{"n over the limit", ok, "s", 11},
		{"no algorithm", with(func(r *Rule) { r.Algorithm = 0 }), "s", 1},
		{"unknown algorithm", with(func(r *Rule) { r.Algorithm = 99 }), "s", 1},
		{"empty name", with(func(r *Rule) { r.Name = "" }), "s", 1},
		{"name with a colon", with(func(r *Rule) { r.Name = "a:b" }), "s", 1},
		{"zero limit", with(func(r *Rule) { r.Limit = 0 }), "s", 1},
		{"limit too large", with(func(r *Rule) { r.Limit = MaxLimit + 1 }), "s", 1},
		{"sliding log limit too large", with(func(r *Rule) { r.Algorithm, r.Limit = SlidingLog, MaxSlidingLogLimit+1 }), "s", 1},
		{"period too short", with(func(r *Rule) { r.Period = time.Microsecond }), "s", 1},
		{"negative period", with(func(r *Rule) { r.Period = -time.Second }), "s", 1},
		{"period too long", with(func(r *Rule) { r.Period = MaxPeriod + time.Second }), "s", 1},
	} {
		_, err := s.AllowN(ctx, tc.rule, tc.subject, tc.n)
		assert.ErrorIs(t, err, ErrInvalid, tc.name)
	}
	for _, tc := range []struct {
		name   string
		tag    string
		checks []Check
	}{
		{"no checks", "t", nil},
		{"too many checks", "t", make([]Check, MaxChecks+1)},
		{"empty tag", "", []Check{{Rule: ok, Subject: "s", N: 1}}},
		{"tag with a closing brace", "x}", []Check{{Rule: ok, Subject: "s", N: 1}}},
		{"one rule twice for a subject", "t", []Check{{Rule: ok, Subject: "s", N: 1}, {Rule: ok, Subject: "s", N: 2}}},
		{"a bad check among good ones", "t", []Check{{Rule: ok, Subject: "s", N: 1}, {Rule: ok, Subject: "u", N: 0}}},
	} {
		_, err := s.AllowMulti(ctx, tc.tag, tc.checks)
		assert.ErrorIs(t, err, ErrInvalid, tc.name)
	}
	for _, r := range []ShaperRule{
		{Name: "s", Limit: 0, Period: time.Second},
		{Name: "s", Limit: 1, Period: 0},
		{Name: "", Limit: 1, Period: time.Second},
		{Name: "s", Limit: 1, Period: time.Second, MaxWait: -1},
	} {
		_, err := s.NewShaper(r)
		assert.ErrorIs(t, err, ErrInvalid, "%+v", r)
	}
	sh, err := s.NewShaper(ShaperRule{Name: "s", Limit: 2, Period: time.Second})
	require.NoError(t, err)
	for _, n := range []int64{0, 3} {
		_, err := sh.ReserveN(ctx, "s", n)
		assert.ErrorIs(t, err, ErrInvalid, "n=%d", n)
	}
	_, err = sh.Reserve(ctx, "")
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Zero(t, s.Stats().Calls, "nothing invalid was sent")
	assert.Zero(t, len(m.Keys()))

	// A rule of the same name with two algorithms keeps two sets of keys (no WRONGTYPE).
	for _, a := range []Algorithm{TokenBucket, GCRA, FixedWindow, SlidingWindow, SlidingLog} {
		_, err := s.Allow(ctx, Rule{Name: "same", Algorithm: a, Limit: 1, Period: time.Second}, "s")
		require.NoError(t, err, "%v", a)
	}

	_, err = New(nil)
	assert.ErrorIs(t, err, ErrInvalid, "no client")
	for _, opt := range []Option{
		WithKeyPrefix(""), WithKeyPrefix("a{"), WithKeyPrefix("a b"), WithTimeout(0), WithTimeout(-time.Second),
		WithBreaker(0, time.Second, 0), WithBreaker(1, 0, 0), WithBreaker(1, time.Second, -1),
		WithKeyPrefix(strings.Repeat("p", 65)), nil,
	} {
		_, err := New(rdb, opt)
		assert.ErrorIs(t, err, ErrInvalid)
	}
	assert.Equal(t, "sliding_log", SlidingLog.String())
	assert.Equal(t, "Algorithm(9)", Algorithm(9).String())
}

func TestStrictScriptRejectsBadArguments(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) {
		ctx := context.Background()
		script := allScript.Variant(true)
		k1, k2 := "t:v1:{bad}:r:tb", "t:v1:{bad}:r:sl"
		good := []any{"0", "0", "tb", "10", "1000000", "1"}
		replace := func(i int, v any) []any {
			a := append([]any(nil), good...)
			a[i] = v
			return a
		}
		for _, tc := range []struct {
			name string
			keys []string
			args []any
		}{
			{"nan time", []string{k1}, replace(0, "nan")},
			{"negative time", []string{k1}, replace(0, "-1")},
			{"fractional time", []string{k1}, replace(0, "1.5")},
			{"inf max wait", []string{k1}, replace(1, "inf")},
			{"unknown algorithm", []string{k1}, replace(2, "xx")},
			{"nan limit", []string{k1}, replace(3, "nan")},
			{"inf limit", []string{k1}, replace(3, "inf")},
			{"zero limit", []string{k1}, replace(3, "0")},
			{"fractional limit", []string{k1}, replace(3, "2.5")},
			{"limit over 1e9", []string{k1}, replace(3, "1000000001")},
			{"period under 1ms", []string{k1}, replace(4, "999")},
			{"nan period", []string{k1}, replace(4, "nan")},
			{"garbage n", []string{k1}, replace(5, "x")},
			{"n over limit", []string{k1}, replace(5, "11")},
			{"zero n", []string{k1}, replace(5, "0")},
			{"missing rule args", []string{k1}, good[:5]},
			{"too few keys", nil, good},
			{"too many keys", []string{k1, k2}, good},
			{"sliding log over its cap", []string{k2, k2 + "s"}, []any{"0", "0", "sl", "100001", "1000000", "1"}},
			{"repeated key", []string{k1, k1}, append(append([]any(nil), good...), "tb", "10", "1000000", "1")},
		} {
			err := script.Eval(ctx, rdb, tc.keys, tc.args...).Err()
			require.Error(t, err, tc.name)
			assert.Contains(t, err.Error(), "hybridrate: bad", tc.name)
		}
		n, err := rdb.DBSize(ctx).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "a rejected call writes nothing")
	})
}

func TestStrictScriptsAssemble(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	assert.Same(t, algoScripts[FixedWindow], algoScripts[UpstreamWindow], "one script serves both windows")
	for i, sc := range append(algoScripts[1:UpstreamWindow], allScript, shaperScript) {
		require.NotNil(t, sc, i)
		assert.NotEqual(t, sc.Variant(false).Hash(), sc.Variant(true).Hash(), "script %d has two variants", i)
		assert.False(t, seen[sc.Variant(false).Hash()], "script %d is distinct", i)
		seen[sc.Variant(false).Hash()] = true
	}
	all := assemble("X")
	assert.True(t, strings.HasPrefix(all, "#!lua\n"), "the shebang stays first")
	assert.Equal(t, 1, strings.Count(all, "\nX\n"), "spliced once")
	assert.NotContains(t, all, marker)
}

func TestStrictShebang(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, real bool) {
		s := newTestStrict(t, rdb)
		_, err := s.Allow(context.Background(), Rule{Name: "r", Algorithm: GCRA, Limit: 1, Period: time.Second}, "s")
		require.NoError(t, err)
		assert.Equal(t, !real, s.runner.Legacy(), "Redis 7 runs the scripts with their #!lua line; miniredis cannot")
	})
}

func TestStrictNoScriptRecovery(t *testing.T) {
	forEachStrict(t, func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, s *Limiter) {
		rule := Rule{Name: "r", Algorithm: SlidingWindow, Limit: 5, Period: time.Second}
		s.at(0)
		for i := 0; i < 3; i++ {
			require.NoError(t, rdb.ScriptFlush(ctx).Err())
			r, err := s.Decide(ctx, rule, "s")
			require.NoError(t, err, "after SCRIPT FLUSH %d", i)
			assert.Equal(t, int64(4-i), r.Remaining)
		}
	})
}

func TestStrictHashSubjects(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) {
		ctx := context.Background()
		rule := Rule{Name: "login", Algorithm: SlidingLog, Limit: 5, Period: time.Minute}
		email := "alice@example.com"
		plain := newTestStrict(t, rdb, WithHashedSubjects(nil))
		keyed := newTestStrict(t, rdb, WithHashedSubjects([]byte("secret")))
		for _, s := range []*Limiter{plain, keyed} {
			_, err := s.Allow(ctx, rule, email)
			require.NoError(t, err)
			_, err = s.AllowMulti(ctx, "tenant{a}", []Check{{Rule: rule, Subject: "10.0.0.1", N: 1}})
			require.NoError(t, err, "braces are fine in a hashed tag")
		}
		keys, err := rdb.Keys(ctx, "*").Result()
		require.NoError(t, err)
		sort.Strings(keys)
		require.Len(t, keys, 8)
		for _, k := range keys {
			assert.NotContains(t, k, "alice", k)
			assert.NotContains(t, k, "10.0.0.1", k)
			assert.NotContains(t, k, "tenant", k)
		}
		// sha256("alice@example.com")[:16] in hex.
		assert.Contains(t, keys, "t:v1:{ff8d9819fc0e12bf0d24892e45987e24}:login:sl")
		assert.NotEqual(t, plain.hashed(email), keyed.hashed(email), "the key changes the hash")
		assert.Len(t, keyed.hashed(email), 32)
	})
}

func TestStrictKeys(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "hr:v1:{acme}:api:tb:user-1", key("hr", "acme", "api", "tb", "user-1"))
	assert.Equal(t, "hr:v1:{acme}:api:tb", key("hr", "acme", "api", "tb", "acme"), "the subject is the tag")
	// Every key of a call starts with the same "<prefix>:v1:{<tag>}", so all share one slot, whatever
	// the subjects (even with braces in them) and even with a '{' in the tag.
	for _, tag := range []string{"acme", "a{b", "x", strings.Repeat("z", 300)} {
		slot := redisx.Slot(key("hr", tag, "r", "tb", tag))
		for _, subj := range []string{"u", "{u}", "}", "a}b{c}", "\x00"} {
			for _, code := range []string{"tb", "gcra", "fw", "sw", "sl", "sls", "lb"} {
				assert.Equal(t, slot, redisx.Slot(key("hr", tag, "r", code, subj)), "tag %q subject %q", tag, subj)
			}
		}
	}
}

func TestStrictBreaker(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond,
		DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	s := newTestStrict(t, rdb, WithBreaker(3, time.Hour, 0))
	rule := Rule{Name: "r", Algorithm: FixedWindow, Limit: 1, Period: time.Second}
	for i := 0; i < 3; i++ {
		_, err := s.Allow(context.Background(), rule, "s")
		require.Error(t, err)
		assert.True(t, IsTransport(err), "%v", err)
	}
	assert.Equal(t, BreakerOpen, s.BreakerState())
	_, err = s.Allow(context.Background(), rule, "s")
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.Equal(t, int64(3), s.Stats().Calls)
	assert.Equal(t, int64(1), s.Stats().Rejected)
}

func TestStrictCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t, 3, 0)
	rdb := c.Client(t)
	ctx := context.Background()
	s := newTestStrict(t, rdb)
	// Many tags, so the calls land on every master; each call's keys share its tag's slot, and Redis 7
	// (with the scripts' #!lua line) checks that the scripts touch only their declared keys.
	for i := 0; i < 30; i++ {
		tag := "tenant-" + strconv.Itoa(i)
		m, err := s.AllowMulti(ctx, tag, []Check{
			{Rule: Rule{Name: "u", Algorithm: TokenBucket, Limit: 5, Period: time.Second}, Subject: "user-" + strconv.Itoa(i), N: 1},
			{Rule: Rule{Name: "l", Algorithm: SlidingLog, Limit: 5, Period: time.Second}, Subject: "ip-" + strconv.Itoa(i), N: 1},
			{Rule: Rule{Name: "t", Algorithm: FixedWindow, Limit: 5, Period: time.Second}, Subject: tag, N: 1},
		})
		require.NoError(t, err, tag)
		assert.True(t, m.Allowed, tag)
	}
	assert.False(t, s.runner.Legacy())
}

func TestStrictDecodeRejectsBadReplies(t *testing.T) {
	t.Parallel()
	limit := func(int) int64 { return 10 }
	for _, res := range []any{
		nil,
		"x",
		[]any{int64(1)},
		[]any{int64(2), int64(1), int64(1), int64(0), int64(0)},
		[]any{int64(1), "1", int64(1), int64(0), int64(0)},
		[]any{int64(1), int64(0), int64(1), int64(0), int64(0)},  // all allowed, the rule denied
		[]any{int64(1), int64(1), int64(11), int64(0), int64(0)}, // remaining above the limit
		[]any{int64(0), int64(0), int64(1), int64(-1), int64(0)},
		[]any{int64(0), int64(0), int64(1), int64(1 << 62), int64(0)},  // a wait that overflows a Duration
		[]any{int64(0), int64(0), int64(1), int64(0), int64(1e15 + 1)}, // a reset beyond the scripts' clamp
	} {
		var out [1]Decision
		_, err := decode(res, out[:], limit, nil)
		assert.ErrorIs(t, err, ErrBadReply, "%v", res)
	}
}

func TestStrictRuleBounds(t *testing.T) {
	t.Parallel()
	assert.ErrorIs(t, Rule{Name: "r", Algorithm: GCRA, Limit: 1, Period: time.Duration(math.MaxInt64)}.Validate(), ErrInvalid)
	assert.NoError(t, Rule{Name: "r", Algorithm: GCRA, Limit: MaxLimit, Period: MaxPeriod}.Validate())
	assert.True(t, errors.Is(fmt.Errorf("x: %w", ErrInvalid), ErrInvalid))
}

func TestStrictAllowNSharesMultiCounter(t *testing.T) {
	forEachStrict(t, func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, s *Limiter) {
		rule := Rule{Name: "r", Algorithm: FixedWindow, Limit: 5, Period: time.Minute}
		s.at(0)
		r, err := s.DecideN(ctx, rule, "acme", 2)
		require.NoError(t, err)
		require.Equal(t, int64(3), r.Remaining)
		// AllowN(rule, s) is AllowMulti(tag s, {rule, s}): one counter.
		m, err := s.AllowMulti(ctx, "acme", []Check{{Rule: rule, Subject: "acme", N: 3}})
		require.NoError(t, err)
		assert.True(t, m.Allowed)
		assert.Equal(t, int64(0), m.Decisions[0].Remaining)
		keys, err := rdb.Keys(ctx, "*").Result()
		require.NoError(t, err)
		assert.Equal(t, []string{"t:v1:{acme}:r:fw"}, keys)
	})
}
