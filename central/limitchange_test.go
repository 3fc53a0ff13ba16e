package central

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLimitChangeKeepsTheBucket (issue 23, item 2): the limit is not part of a bucket's name, so a
// call with a new limit finds the consumption of the old one: tokens clamped to a lower burst, a
// raised burst filling at the new rate from the change on, and two nodes sending different limits
// for one key counting in one bucket.
func TestLimitChangeKeepsTheBucket(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		now := t0
		client := func(id string) *Client {
			cfg := testConfig(rdb, id)
			cfg.ScriptNow = func() int64 { return now } // takes and reconciles on one test clock
			c, err := New(cfg)
			require.NoError(t, err)
			return c
		}
		a, b := client("a"), client("b")
		old, raised := Limit{Rate: 1, Burst: 3}, Limit{Rate: 0.1, Burst: 4}
		na := &node{c: a, key: "k", lim: old, inc: 1}
		st := na.call(t, 0, 3, 3)
		require.Equal(t, StatusCovered, st.Status)
		assert.EqualValues(t, 0, st.Tokens, "the old limit's burst is spent")

		// Node b runs the raised limit on the same key: same bucket, nothing to lend.
		nb := &node{c: b, key: "k", lim: raised, inc: 1}
		now = t0 + 1_000_000 // 1 s later, at the caller's rate: 0.1 token
		st = nb.call(t, 0, 1, 1)
		assert.Equal(t, StatusDenied, st.Status, "a raised burst is not a fresh bucket")
		assert.EqualValues(t, 100_000, st.Tokens, "refilled at the new rate")
		assert.Equal(t, 9*time.Second, st.RetryAfter, "0.9 token at 0.1/s")
		st, err := b.Take(ctx, Update{Key: "k", Limit: raised, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusDenied, st.Status, "a one-off take under the new limit too")

		// 100 s later the bucket is full under the new burst (4), not the old one (3).
		now = t0 + 101_000_000
		st = nb.call(t, 0, 4, 4)
		assert.Equal(t, StatusCovered, st.Status, "the raised burst fills at the new rate")
		assert.EqualValues(t, 0, st.Tokens)

		// Node a, still on the old limit, finds what b left: one bucket for both.
		st = na.call(t, 3, 1, 1)
		assert.Equal(t, StatusDenied, st.Status, "the old limit's node counts in the same bucket")

		// A lower burst clamps what the bucket holds.
		now = t0 + 1_000_000_000
		st = nb.call(t, 0, 0, 0)
		assert.EqualValues(t, 4_000_000, st.Tokens)
		low := Limit{Rate: 0.1, Burst: 2}
		st, err = b.Take(ctx, Update{Key: "k", Limit: low, Want: 2, N: 2})
		require.NoError(t, err)
		assert.Equal(t, StatusCovered, st.Status)
		assert.EqualValues(t, 0, st.Tokens, "clamped to the lower burst, then 2 taken")

		keys, err := rdb.Keys(ctx, "t:*").Result()
		require.NoError(t, err)
		assert.Equal(t, []string{BucketKey("t", "k")}, keys, "one Redis key for every limit")
	})
}

// TestBanInTheBucket (issue 23, item 6): a ban is written into the key's bucket, and every script
// that admits (reconcile.lua's leases and takes, take.lua) reads it in the same HMGET: a banned key
// gets nothing from Redis whatever the node's local copy of the ban list holds; the node's report
// is still applied; Unban lifts it.
func TestBanInTheBucket(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		c := newTestClient(t, rdb, "a")
		lim := Limit{Rate: 10, Burst: 10}
		nd := &node{c: c, key: "k", lim: lim, inc: 1}
		st := nd.call(t, 0, 2, 1) // a bucket with a node record before the ban
		require.Equal(t, StatusCovered, st.Status)

		require.NoError(t, c.Ban(ctx, "k", time.Minute))
		require.NoError(t, c.Ban(ctx, "fresh", time.Minute)) // no bucket yet
		st = nd.call(t, 1, 5, 1)
		assert.Equal(t, StatusBanned, st.Status, "a leasing take of a banned key")
		assert.EqualValues(t, 2, st.Charged, "nothing granted: the lease is what it was")
		assert.InDelta(t, time.Minute.Seconds(), st.RetryAfter.Seconds(), 2, "retry: the ban's remaining time")
		st = nd.call(t, 0, 5, 0)
		assert.Equal(t, StatusBanned, st.Status, "a background reconcile of a banned key")
		assert.EqualValues(t, 2, st.Charged)
		st = nd.call(t, 4, 0, 0)
		assert.EqualValues(t, 5, st.Charged, "consumption beyond the lease (1 + 4 > 2) is still charged as debt")
		for _, key := range []string{"k", "fresh"} {
			st, err := c.Take(ctx, Update{Key: key, Limit: lim, Want: 1, N: 1})
			require.NoError(t, err)
			assert.Equal(t, StatusBanned, st.Status, "%s: a one-off take (take.lua)", key)
			st, err = c.Take(ctx, Update{Key: key, Limit: lim, Want: 1, N: 1, Inc: 7})
			require.NoError(t, err)
			assert.Equal(t, StatusBanned, st.Status, "%s: a node's first leasing take", key)
			out, errs := make([]State, 1), make([]error, 1)
			require.NoError(t, c.Reconcile(ctx, []Update{{Key: key, Limit: lim, Want: 1}}, out, errs))
			assert.Equal(t, StatusBanned, out[0].Status, "%s: a one-off take (reconcile.lua, inc 0)", key)
		}
		if ttl, err := rdb.PTTL(ctx, BucketKey("t", "fresh")).Result(); assert.NoError(t, err) && ttl > 0 {
			assert.Greater(t, ttl, 59*time.Second, "the bucket keeps the ban as long as it lasts")
		}

		ok, err := c.DeleteBucket(ctx, "k", lim)
		require.NoError(t, err)
		assert.True(t, ok)
		st = (&node{c: c, key: "k", lim: lim, inc: 8}).call(t, 0, 2, 1)
		assert.Equal(t, StatusBanned, st.Status, "deleting the bucket (Reset) keeps the ban")
		require.NoError(t, c.Ban(ctx, "only", time.Minute))
		ok, err = c.DeleteBucket(ctx, "only", lim)
		require.NoError(t, err)
		assert.False(t, ok, "a bucket that holds only a ban is no bucket")
		st, err = c.Take(ctx, Update{Key: "only", Limit: lim, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusBanned, st.Status, "and its ban stays")

		require.NoError(t, c.Unban(ctx, "k"))
		st = (&node{c: c, key: "k", lim: lim, inc: 9}).call(t, 0, 2, 1)

		assert.Equal(t, StatusCovered, st.Status, "unbanned")
	})
}
