package central

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPeekAndDeleteBucket(t *testing.T) {
	forEachClient(t, "n1", func(t *testing.T, ctx context.Context, _ redis.UniversalClient, c *Client) {
		lim := Limit{Rate: 0.001, Burst: 10} // one token in 1000s: no refill during the test

		p, err := c.PeekBucket(ctx, "k", lim)
		require.NoError(t, err)
		assert.Equal(t, Peek{Exists: false, Tokens: 10_000_000}, p, "a missing bucket is full")

		st, err := c.Take(ctx, Update{Key: "k", Limit: lim, Inc: 1, Demand: 1, Want: 4, N: 4})
		require.NoError(t, err)
		require.Equal(t, StatusCovered, st.Status)
		p, err = c.PeekBucket(ctx, "k", lim)
		require.NoError(t, err)
		assert.True(t, p.Exists)
		assert.InDelta(t, 6_000_000, p.Tokens, 1000, "the lease of 4 is charged; the peek changes nothing")
		assert.Greater(t, p.ResetAfter.Seconds(), 3000.0)
		again, err := c.PeekBucket(ctx, "k", lim)
		require.NoError(t, err)
		assert.InDelta(t, p.Tokens, again.Tokens, 1000, "a peek takes nothing")

		other, err := c.PeekBucket(ctx, "k", Limit{Rate: 0.001, Burst: 20})
		require.NoError(t, err)
		assert.True(t, other.Exists, "the limit is not part of the bucket's name")
		assert.InDelta(t, 6_000_000, other.Tokens, 1000, "another limit reads the same bucket")
		lower, err := c.PeekBucket(ctx, "k", Limit{Rate: 0.001, Burst: 2})
		require.NoError(t, err)
		assert.Equal(t, int64(2_000_000), lower.Tokens, "clamped to a lower burst")

		ok, err := c.DeleteBucket(ctx, "k", lim)
		require.NoError(t, err)
		assert.True(t, ok)
		ok, err = c.DeleteBucket(ctx, "k", lim)
		require.NoError(t, err)
		assert.False(t, ok, "already deleted")
		p, err = c.PeekBucket(ctx, "k", lim)
		require.NoError(t, err)
		assert.Equal(t, Peek{Tokens: 10_000_000}, p, "full again")

		_, err = c.PeekBucket(ctx, "k", Limit{Rate: 0, Burst: 1})
		assert.ErrorIs(t, err, ErrInvalid)
	})
}
