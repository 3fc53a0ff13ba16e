package hybrid_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

func newMini(t *testing.T, opts ...hybrid.Option) (*hybrid.Limiter, *miniredis.Miniredis) {
	t.Helper()
	m, rdb := redistest.Mini(t)
	// A generous sync timeout: miniredis runs Lua slowly, and a busy CI machine must not turn a
	// decision into a fallback one. Callers' options come after and win.
	lim, err := hybrid.New(rdb, append([]hybrid.Option{hybrid.WithCheckTimeout(time.Second)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = lim.Close(context.Background())
		_ = rdb.Close()
	})
	return lim, m
}

// TestBadInput is DESIGN.md invariant 6: every bad input gets a clear error, never a panic.
func TestBadInput(t *testing.T) {
	lim, _ := newMini(t)
	ok := hybrid.Limit{Rate: 10, Burst: 10}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		key   string
		limit hybrid.Limit
		n     int64
		want  error // nil: a decision, no error
	}{
		{"empty key", ctx, "", ok, 1, hybrid.ErrInvalidKey},
		{"1 MiB key", ctx, strings.Repeat("k", 1<<20), ok, 1, hybrid.ErrInvalidKey},
		{"longest key", ctx, strings.Repeat("k", hybrid.MaxKeyLen), ok, 1, nil},
		{"key with braces", ctx, "{tenant}:a}b{", ok, 1, nil},
		{"key with NUL bytes", ctx, "a\x00b", ok, 1, nil},
		{"n zero", ctx, "k", ok, 0, hybrid.ErrInvalidCost},
		{"n negative", ctx, "k", ok, -3, hybrid.ErrInvalidCost},
		{"n over burst", ctx, "k", ok, 11, hybrid.ErrInvalidCost},
		{"NaN rate", ctx, "k", hybrid.Limit{Rate: math.NaN(), Burst: 10}, 1, hybrid.ErrInvalidLimit},
		{"+Inf rate", ctx, "k", hybrid.Limit{Rate: math.Inf(1), Burst: 10}, 1, hybrid.ErrInvalidLimit},
		{"-Inf rate", ctx, "k", hybrid.Limit{Rate: math.Inf(-1), Burst: 10}, 1, hybrid.ErrInvalidLimit},
		{"negative rate", ctx, "k", hybrid.Limit{Rate: -1, Burst: 10}, 1, hybrid.ErrInvalidLimit},
		{"zero rate", ctx, "k", hybrid.Limit{Rate: 0, Burst: 10}, 1, hybrid.ErrInvalidLimit},
		{"rate over 1e9", ctx, "k", hybrid.Limit{Rate: 2e9, Burst: 10}, 1, hybrid.ErrInvalidLimit},
		{"zero burst", ctx, "k", hybrid.Limit{Rate: 1, Burst: 0}, 1, hybrid.ErrInvalidLimit},
		{"burst over 1e9", ctx, "k", hybrid.Limit{Rate: 1, Burst: 2e9}, 1, hybrid.ErrInvalidLimit},
		{"cancelled context", cancelled, "k", ok, 1, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := lim.DecideN(tc.ctx, tc.key, tc.limit, tc.n)
			allowed, aerr := lim.AllowN(tc.ctx, tc.key, tc.limit, tc.n) // the same checks, the same errors
			if tc.want == nil {
				require.NoError(t, err)
				require.NoError(t, aerr)
				assert.True(t, d.Allowed)
				assert.True(t, allowed)
				return
			}
			assert.ErrorIs(t, err, tc.want)
			assert.ErrorIs(t, aerr, tc.want)
			assert.False(t, d.Allowed, "an error never allows")
			assert.False(t, allowed, "an error never allows")
		})
	}
	// Keys that differ only after a brace or a NUL are different keys.
	for _, k := range []string{"a\x00c", "{tenant}:a}c{"} {
		d, err := lim.DecideN(ctx, k, hybrid.Limit{Rate: 1, Burst: 1}, 1)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "%q has its own bucket", k)
	}
	assert.ErrorIs(t, lim.Ban(ctx, "", time.Second), hybrid.ErrInvalidKey)
	assert.Error(t, lim.Ban(ctx, "k", 0), "zero ban")
}

// TestAllowNDecidesAsDecideN: AllowN and DecideN make one decision the same way (AllowN returns its
// Allowed): calls of both, interleaved, on one key admit the burst once, whichever method asked.
func TestAllowNDecidesAsDecideN(t *testing.T) {
	lim, _ := newMini(t)
	ctx := context.Background()
	for !lim.Ready() {
		time.Sleep(time.Millisecond)
	}
	limit := hybrid.Limit{Rate: 1.0 / 3600, Burst: 6} // no refill within the test
	admitted := int64(0)
	for i := range 12 {
		if i%2 == 0 {
			ok, err := lim.AllowN(ctx, "k", limit, 1)
			require.NoError(t, err)
			if ok {
				admitted++
			}
			continue
		}
		d, err := lim.DecideN(ctx, "k", limit, 1)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
			assert.Zero(t, d.RetryAfter)
		} else {
			assert.Positive(t, d.RetryAfter, "a denial says when to retry")
		}
	}
	assert.Equal(t, limit.Burst, admitted, "one burst, whichever method decided")
	ok, err := lim.AllowN(ctx, "k", limit, 1)
	require.NoError(t, err)
	assert.False(t, ok)
	require.NoError(t, lim.Flush(ctx)) // Stats().Local counts the fast path's decisions when the syncer collects their keys
	s := lim.Stats()
	assert.Equal(t, int64(13), s.Local+s.LocalDenied+s.Central+s.CentralDenied+s.DenyCache+s.FallbackAllowed+s.FallbackDenied,
		"every decision counted, whichever method made it")
}

func TestNewRejectsBadOptions(t *testing.T) {
	_, err := hybrid.New(nil)
	assert.ErrorIs(t, err, hybrid.ErrNilClient)
	var nilClient *redis.Client
	_, err = hybrid.New(nilClient)
	assert.ErrorIs(t, err, hybrid.ErrNilClient, "a typed nil")
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	for _, opt := range []hybrid.Option{
		hybrid.WithSyncInterval(0),
		hybrid.WithSyncInterval(time.Hour),
		hybrid.WithDriftThreshold(-0.1),
		hybrid.WithDriftThreshold(1.5),
		hybrid.WithDriftThreshold(math.NaN()),
		hybrid.WithFailurePolicy(outcome.FailurePolicy(9)),
		hybrid.WithKeyPrefix(""),
		hybrid.WithKeyPrefix("a{b"),
		hybrid.WithMaxKeys(10),
		hybrid.WithCheckTimeout(0),
		hybrid.WithFlushTimeout(0),
		hybrid.WithLogger(nil),
		hybrid.WithMeterProvider(nil),
		hybrid.WithTracerProvider(nil),
		hybrid.WithNodeID("bad id"),
		hybrid.WithLeaseAdvance(-time.Second),
		hybrid.WithLeaseAdvance(time.Hour),
		nil,
	} {
		_, err := hybrid.New(rdb, opt)
		assert.ErrorIs(t, err, hybrid.ErrBadOption)
	}
}

func TestClosedLimiter(t *testing.T) {
	lim, _ := newMini(t)
	ctx := context.Background()
	require.NoError(t, lim.Close(ctx))
	require.NoError(t, lim.Close(ctx), "a second Close is a no-op")
	_, err := lim.Allow(ctx, "k", hybrid.PerSecond(1))
	assert.ErrorIs(t, err, hybrid.ErrClosed)
	assert.ErrorIs(t, lim.Flush(ctx), hybrid.ErrClosed)
	assert.ErrorIs(t, lim.Ban(ctx, "k", time.Second), hybrid.ErrClosed)
}

func TestNewDoesNoIOAndRedisDownAtStart(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	for _, tc := range []struct {
		policy  outcome.FailurePolicy
		allowed bool
	}{{outcome.FailOpen, true}, {outcome.FailClosed, false}, {outcome.LocalFallback, true}} {
		// Without the cold-start credit the first decision needs Redis (with it, the first tokens
		// of a new key are admitted locally whatever the policy: TestColdStartWithRedisDown).
		lim, err := hybrid.New(rdb, hybrid.WithFailurePolicy(tc.policy), hybrid.WithoutColdStart())
		require.NoError(t, err)
		d, err := lim.Decide(context.Background(), "k", hybrid.PerSecond(10))
		require.NoError(t, err, tc.policy.String())
		assert.Equal(t, tc.allowed, d.Allowed, tc.policy.String())
		assert.Equal(t, outcome.SourceFallback, d.Source)
		assert.Equal(t, tc.policy == outcome.FailClosed, d.Unavailable, "%v: only a fail-closed denial is Unavailable", tc.policy)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = lim.Close(ctx)
		cancel()
		if tc.allowed {
			assert.Error(t, err, "%v: the final flush cannot reach Redis", tc.policy)
			assert.False(t, errors.Is(err, hybrid.ErrClosed))
		} else {
			assert.NoError(t, err, "%v: nothing was admitted, nothing to flush", tc.policy)
		}
	}
}

// TestColdStartWithRedisDown: with Redis down from the start, the limiter never read the ban list,
// so a key it has never seen gets no cold-start credit (it could be banned: issue 23, item 6) and
// the failure policy decides. (Until issue 23 it got max(2, drift·Burst/A) tokens of credit.)
func TestColdStartWithRedisDown(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := hybrid.New(rdb, hybrid.WithFailurePolicy(outcome.FailClosed))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = lim.Close(ctx)
	})
	limit := hybrid.Limit{Rate: 10, Burst: 40} // credit: 0.1·40 = 4 tokens
	var sources []outcome.Source
	for range 6 {
		d, err := lim.Decide(context.Background(), "cold", limit)
		require.NoError(t, err)
		if d.Allowed {
			sources = append(sources, d.Source)
		}
	}
	// A limiter that could not read the ban list does not know which keys are banned: it grants no
	// cold-start credit (issue 23, item 6), and the failure policy decides from the first request.
	assert.False(t, lim.BansLoaded())
	assert.Empty(t, sources, "no cold-start credit before the ban list is read: fail-closed")
}

func TestLocalFallbackEnforcesShare(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	lim, err := hybrid.New(rdb, hybrid.WithClock(func() time.Time { return now }), hybrid.WithoutColdStart())
	require.NoError(t, err)
	t.Cleanup(func() { _ = lim.Close(context.Background()) })
	admitted := 0
	for range 50 {
		d, err := lim.Decide(context.Background(), "k", hybrid.Limit{Rate: 10, Burst: 20})
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
	}
	assert.Equal(t, 20, admitted, "with one known node the fallback bucket holds the whole burst; the clock stands still")
	st := lim.Stats()
	assert.Equal(t, int64(20), st.FallbackAllowed)
	assert.Equal(t, int64(1), st.Pending, "the admitted tokens wait for Redis")
}

// TestLimitOnFailureOverridesTheDefault: with Redis down, each call's Limit.OnFailure decides, and
// outcome.DefaultFailure falls back to the limiter's WithFailurePolicy; the policy does not split the bucket.
func TestLimitOnFailureOverridesTheDefault(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	for _, def := range []outcome.FailurePolicy{outcome.FailClosed, outcome.FailOpen} {
		lim, err := hybrid.New(rdb, hybrid.WithFailurePolicy(def), hybrid.WithoutColdStart(),
			hybrid.WithClock(func() time.Time { return now }))
		require.NoError(t, err)
		assert.Equal(t, def, lim.FailurePolicy())
		for _, tc := range []struct {
			on   outcome.FailurePolicy
			want []bool // three calls with a burst of 2
		}{
			{outcome.DefaultFailure, map[outcome.FailurePolicy][]bool{
				outcome.FailClosed: {false, false, false}, outcome.FailOpen: {true, true, true}}[def]},
			{outcome.FailOpen, []bool{true, true, true}},
			{outcome.FailClosed, []bool{false, false, false}},
			{outcome.LocalFallback, []bool{true, true, false}},
		} {
			key := "k-" + tc.on.String()
			var got []bool
			for range 3 {
				d, err := lim.Decide(context.Background(), key, hybrid.Limit{Rate: 0.001, Burst: 2, OnFailure: tc.on})
				require.NoError(t, err)
				assert.Equal(t, outcome.SourceFallback, d.Source)
				assert.Equal(t, tc.on, d.Limit.OnFailure, "the decision reports the limit it was made under")
				got = append(got, d.Allowed)
			}
			assert.Equal(t, tc.want, got, "default %v, limit %v", def, tc.on)
		}
		st := lim.Stats()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_ = lim.Close(ctx) // the final flush cannot reach Redis
		cancel()
		assert.Equal(t, 4, st.Keys, "default %v: one entry per key", def)
	}

	lim, err := hybrid.New(rdb, hybrid.WithoutColdStart(), hybrid.WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = lim.Close(ctx)
	})
	for _, on := range []outcome.FailurePolicy{outcome.FailOpen, outcome.FailClosed, outcome.LocalFallback} {
		_, err := lim.Allow(context.Background(), "shared", hybrid.Limit{Rate: 1, Burst: 5, OnFailure: on})
		require.NoError(t, err)
	}
	assert.Equal(t, 1, lim.Stats().Keys, "OnFailure does not split the bucket")

	_, err = lim.Allow(context.Background(), "k", hybrid.Limit{Rate: 1, Burst: 1, OnFailure: 9})
	assert.ErrorIs(t, err, hybrid.ErrInvalidLimit)
	assert.ErrorIs(t, hybrid.Limit{Rate: 1, Burst: 1, OnFailure: -1}.Validate(), hybrid.ErrInvalidLimit)
	assert.NoError(t, hybrid.Limit{Rate: 1, Burst: 1}.Validate(), "outcome.DefaultFailure is valid")
}
