package hybrid_test

// Issue 23, items 2 and 6: a key's bucket does not depend on its limit, and a ban reaches every
// decision through Redis whatever the local copy of the ban list holds.

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// admitted calls Allow n times for key under limit and returns how many were admitted.
func admitted(t *testing.T, lim *hybrid.Limiter, key string, limit hybrid.Limit, n int) int {
	t.Helper()
	got := 0
	for i := 0; i < n; i++ {
		d, err := lim.Decide(context.Background(), key, limit)
		require.NoError(t, err)
		if d.Allowed {
			got++
		}
	}
	return got
}

// TestLimitChangeKeepsTheKeysConsumption: a key used with a new limit keeps its bucket (tokens
// clamped to the new burst, refilled at the new rate), on one node (same entry: no second
// cold-start credit or lease) and across nodes running different limits (one bucket in Redis).
// On key layout v4 the rate and burst were part of the bucket's name: both cases got a fresh
// bucket, and the single node a second cold-start credit.
func TestLimitChangeKeepsTheKeysConsumption(t *testing.T) {
	old := hybrid.Limit{Rate: 0.01, Burst: 3}     // no refill within the test
	raised := hybrid.Limit{Rate: 0.001, Burst: 4} // burst 3 → 4, as a policy reload would
	t.Run("one node", func(t *testing.T) {
		srv := redistest.Start(t)
		rdb := srv.Client(t)
		lim := newLimiter(t, rdb, hybrid.WithCheckTimeout(time.Second))
		require.Equal(t, 3, admitted(t, lim, "k", old, 5))
		assert.Zero(t, admitted(t, lim, "k", raised, 5), "the raised burst is not a fresh bucket")
		d, err := lim.Decide(context.Background(), "k", raised)
		require.NoError(t, err)
		assert.Equal(t, raised, d.Limit)
		require.NoError(t, lim.Flush(context.Background()))
		assert.EqualValues(t, 3, consumedIn(t, srv, "k"), "what was admitted, counted once")
	})
	t.Run("two nodes, two limits", func(t *testing.T) {
		srv := redistest.Start(t)
		rdb := srv.Client(t)
		// No cold-start credit: a fresh node's first requests of a key it has never seen are
		// admitted locally (charged to the bucket afterwards: docs/accuracy.md, the bound's third
		// term) once its copy of the ban list is read, which a loaded machine may or may not have
		// done by then; here the question is only which bucket the calls count in.
		a := newLimiter(t, rdb, hybrid.WithCheckTimeout(time.Second), hybrid.WithoutColdStart())
		b := newLimiter(t, rdb, hybrid.WithCheckTimeout(time.Second), hybrid.WithoutColdStart())
		require.Equal(t, 3, admitted(t, a, "k", old, 5))
		require.NoError(t, a.Flush(context.Background()))
		assert.Zero(t, admitted(t, b, "k", raised, 5), "the node on the new limit counts in the same bucket")
		assert.Zero(t, admitted(t, a, "k", old, 3))
		require.NoError(t, a.Flush(context.Background()))
		require.NoError(t, b.Flush(context.Background()))
		keys := srv.Do(t, "KEYS", hybrid.DefaultKeyPrefix+":*:b:*").([]any)
		assert.Equal(t, []any{bucketKey("k")}, keys, "one bucket for both limits")
		assert.EqualValues(t, 3, consumedIn(t, srv, "k"))
	})
}

// consumedIn returns the tokens Redis has counted as admitted for key.
func consumedIn(t *testing.T, srv *redistest.Server, key string) int64 {
	t.Helper()
	b, ok := srv.Do(t, "HGET", bucketKey(key), central.BucketField).(string)
	require.True(t, ok, "the bucket exists")
	st, err := central.ParseBucket(b)
	require.NoError(t, err)
	return st.Consumed
}

// TestBannedKeyBeyondTheCapIsNeverAdmitted: with more bans than a node's local copy holds (a cap of
// 100 here, 65,536 by default), a fresh node admits no banned key, not even once: no cold-start
// credit while the copy is not known to be complete, and the first call for a key reads the ban
// in its bucket (reconcile.lua, take.lua). Before, a key beyond the cap got its cold-start credit
// and the first synchronous take's lease (3–6 admissions) before its first denial.
func TestBannedKeyBeyondTheCapIsNeverAdmitted(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	banner := newLimiter(t, rdb)
	const n = 150
	for i := 0; i < n; i++ {
		require.NoError(t, banner.Ban(ctx, "banned:"+strconv.Itoa(i), time.Hour))
	}
	limit := hybrid.Limit{Rate: 1000, Burst: 1000}
	check := func(t *testing.T, lim *hybrid.Limiter) {
		got := 0
		for i := 0; i < n; i++ {
			got += admitted(t, lim, "banned:"+strconv.Itoa(i), limit, 3)
		}
		assert.Zero(t, got, "banned keys admitted")
		assert.Equal(t, 3, admitted(t, lim, "free", limit, 3), "a key that is not banned is admitted")
	}
	t.Run("at once", func(t *testing.T) {
		check(t, newLimiter(t, rdb, hybrid.WithMaxBans(100), hybrid.WithCheckTimeout(time.Second)))
	})
	t.Run("once the list is read", func(t *testing.T) {
		lim := newLimiter(t, rdb, hybrid.WithMaxBans(100), hybrid.WithCheckTimeout(time.Second))
		require.Eventually(t, func() bool { return lim.Stats().BanListSize == n }, 5*time.Second, 5*time.Millisecond)
		require.Equal(t, 100, lim.Stats().Bans, "the local copy is full: 50 bans are not in it")
		check(t, lim)
	})
}
