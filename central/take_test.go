package central

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
)

// TestTakeMatchesReconcile (issue 21): one-off takes (take.lua) and reconcile.lua share one bucket:
// a one-off take is counted, refills as reconcile.lua's state does, leaves no node record, denies
// exactly when the bucket cannot cover n (writing nothing), and sets the same TTL; a node's
// reconcile then sees the bucket the takes left, and a one-off take draws on the advance on the
// same terms as a renewal (the key's declared demand under its rate).
func TestTakeMatchesReconcile(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, real bool) {
		ctx := context.Background()
		now := t0
		cfg := testConfig(rdb, "a")
		cfg.ScriptNow = func() int64 { return now }
		cfg.Advance = time.Second
		c, err := New(cfg)
		require.NoError(t, err)
		lim := Limit{Rate: 2, Burst: 4}
		key := BucketKey("t", "k")
		for i := range 4 {
			st, err := c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
			require.NoError(t, err)
			assert.Equal(t, StatusCovered, st.Status, "take %d", i)
			assert.EqualValues(t, (3-i)*1_000_000, st.Tokens, "take %d", i)
		}
		st, err := c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusDenied, st.Status)
		assert.Equal(t, 500*time.Millisecond, st.RetryAfter, "one token at 2/s")
		fields, err := rdb.HKeys(ctx, key).Result()
		require.NoError(t, err)
		assert.Equal(t, []string{"b"}, fields, "no node record")
		if real {
			ttl, err := rdb.PTTL(ctx, key).Result()
			require.NoError(t, err)
			// reconcile.lua's TTL: 2·(burst + rate·advance)/rate s + 1 s, at least the active window.
			assert.InDelta(t, float64(max(2000*(4+2)/2+1000, cfg.ActiveWindow.Milliseconds())), float64(ttl.Milliseconds()), 50)
		}
		b, err := rdb.HGet(ctx, key, "b").Result()
		require.NoError(t, err)
		bk, err := ParseBucket(b)
		require.NoError(t, err)
		assert.EqualValues(t, 4, bk.Consumed, "the takes are counted")

		// 1 s later the bucket holds 2 tokens; a node's reconcile reads the takes' state.
		now += 1e6
		n := &node{c: c, key: "k", lim: lim, inc: 1}
		st = n.call(t, 0, 2, 2)
		assert.Equal(t, StatusCovered, st.Status)
		// The node declared 1 token/s, under the key's rate: like its renewals, a one-off take may
		// draw on the coming refill of the advance (1 s × 1 token/s), once, then it is denied.
		st, err = c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusCovered, st.Status, "the advance lent under the rate")
		assert.EqualValues(t, -1_000_000, st.Tokens)
		st, err = c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusDenied, st.Status, "the reconcile and the advance took what there was")
		assert.Equal(t, 500*time.Millisecond, st.RetryAfter, "from -1 to 0 at 2/s: then the advance covers a token again")
	})
}
