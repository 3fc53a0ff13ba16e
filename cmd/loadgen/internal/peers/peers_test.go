package peers

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
)

func TestStrictTakesUpToBurstThenDenies(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) {
		ctx := context.Background()
		// 0.001 tokens/s: nothing refills during the test.
		s, err := NewStrict(rdb, 0.001, 3)
		require.NoError(t, err)
		key := StrictKey("t:", "k")
		steps := []struct {
			n       int64
			allowed bool
			rem     int64
		}{
			{1, true, 2},
			{2, true, 0},
			{1, false, 0},
			{3, false, 0},
		}
		for i, st := range steps {
			r, err := s.AllowN(ctx, key, st.n)
			require.NoError(t, err, "step %d", i)
			assert.Equal(t, st.allowed, r.Allowed, "step %d allowed", i)
			assert.Equal(t, st.rem, r.Remaining, "step %d remaining", i)
			if st.allowed {
				assert.Zero(t, r.RetryAfter, "step %d", i)
			} else {
				// n tokens at 0.001/s take n·1000s, less the little refilled since.
				assert.InDelta(t, float64(st.n)*1000, r.RetryAfter.Seconds(), 1, "step %d retry-after", i)
			}
		}
		ttl, err := rdb.PTTL(ctx, key).Result()
		require.NoError(t, err)
		assert.Greater(t, ttl, 2000*time.Second, "the key lives until it would be full again")
	})
}

func TestStrictRefillsByRedisTime(t *testing.T) {
	m, rdb := redistest.Mini(t)
	ctx := context.Background()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m.SetTime(t0)
	s, err := NewStrict(rdb, 2, 4) // 2 tokens/s, burst 4
	require.NoError(t, err)
	key := StrictKey("t:", "refill")
	steps := []struct {
		at      time.Duration
		n       int64
		allowed bool
		rem     int64
		retry   time.Duration
	}{
		{0, 4, true, 0, 0},
		{0, 1, false, 0, 500 * time.Millisecond},
		{250 * time.Millisecond, 1, false, 0, 250 * time.Millisecond}, // half a token
		{500 * time.Millisecond, 1, true, 0, 0},
		{10 * time.Second, 4, true, 0, 0}, // refilled to the burst, not beyond
		{10 * time.Second, 1, false, 0, 500 * time.Millisecond},
	}
	for i, st := range steps {
		m.SetTime(t0.Add(st.at))
		r, err := s.AllowN(ctx, key, st.n)
		require.NoError(t, err, "step %d", i)
		assert.Equal(t, st.allowed, r.Allowed, "step %d allowed", i)
		assert.Equal(t, st.rem, r.Remaining, "step %d remaining", i)
		assert.Equal(t, st.retry, r.RetryAfter, "step %d retry-after", i)
	}
}

func TestStrictRejectsBadArguments(t *testing.T) {
	_, err := NewStrict(nil, 0, 1)
	assert.Error(t, err)
	_, err = NewStrict(nil, 1, 0)
	assert.Error(t, err)
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) {
		s, err := NewStrict(rdb, 10, 5)
		require.NoError(t, err)
		_, err = s.AllowN(context.Background(), StrictKey("t:", "bad"), 6)
		assert.ErrorContains(t, err, "bad n")
		_, err = s.AllowN(context.Background(), StrictKey("t:", "bad"), 0)
		assert.ErrorContains(t, err, "bad n")
	})
}

func TestLocalBucket(t *testing.T) {
	t.Parallel()
	l := NewLocal(10, 5) // 10 tokens/s, burst 5
	ms := time.Millisecond
	steps := []struct {
		key     string
		now     time.Duration
		n       int64
		allowed bool
	}{
		{"a", 0, 5, true},
		{"a", 0, 1, false},
		{"b", 0, 5, true}, // every key has its own bucket
		{"a", 50 * ms, 1, false},
		{"a", 100 * ms, 1, true}, // one token after 100ms
		{"a", 100 * ms, 1, false},
		{"a", 10 * time.Second, 5, true}, // capped at the burst
		{"a", 10 * time.Second, 1, false},
		{"a", 5 * time.Second, 1, false}, // time going back refills nothing
	}
	for i, s := range steps {
		if got := l.AllowN(s.key, s.now, s.n); got != s.allowed {
			t.Errorf("step %d: AllowN(%q, %v, %d) = %v, want %v", i, s.key, s.now, s.n, got, s.allowed)
		}
	}
}

func TestXRate(t *testing.T) {
	t.Parallel()
	x := NewXRate(0.001, 3)
	assert.True(t, x.AllowN("a", 3))
	assert.False(t, x.AllowN("a", 1))
	assert.True(t, x.AllowN("b", 1), "every key has its own limiter")
}
