package central

import (
	"context"
	"math"
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
		assert.ElementsMatch(t, []string{"b", "o"}, fields, "no node record; the one-off demand")
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

		// 3 s later the bucket is full again (4 tokens) and the takes' demand has decayed to
		// 4·e⁻³ ≈ 0.2 tokens/s; a node's reconcile reads the takes' state and leases all 4.
		now += 3e6
		n := &node{c: c, key: "k", lim: lim, inc: 1}
		st = n.call(t, 0, 4, 4)
		assert.Equal(t, StatusCovered, st.Status)
		assert.InDelta(t, 1+4*math.Exp(-3), st.Demand, 0.002, "the node's declared demand and the one-off takes'")
		// The key's demand, 1.2 tokens/s, is under its rate: like its renewals, a one-off take may
		// draw on the coming refill of the advance (1 s × 1.2 tokens/s, a whole token), once, then
		// it is denied.
		st, err = c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusCovered, st.Status, "the advance lent under the rate")
		assert.EqualValues(t, -1_000_000, st.Tokens)
		st, err = c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusDenied, st.Status, "the reconcile and the advance took what there was")
		// With that take the key's demand is 2.2 tokens/s, over its rate: no advance is lent, and
		// the bucket must refill from -1 to 1 at 2/s.
		assert.Equal(t, time.Second, st.RetryAfter)
	})
}

// TestOneOffTakesCountInTheKeysDemand (issue 21): the nodes on one-off takes keep no record and
// declare no demand, so take.lua counts what they take in the key's one-off demand (the bucket's o
// field, a rate decayed over a second), and reconcile.lua sizes a leasing node's share by the
// declared demand plus that rate. Without it, the first nodes of a fleet to lease a key read their
// share as most of it while the rest of the fleet was still on one-off takes (hot keys on 512
// nodes: 0.64% false denials, all in the keys' first seconds).
func TestOneOffTakesCountInTheKeysDemand(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, real bool) {
		ctx := context.Background()
		now := t0
		cfg := testConfig(rdb, "a")
		cfg.ScriptNow = func() int64 { return now }
		c, err := New(cfg)
		require.NoError(t, err)
		lim := Limit{Rate: 100, Burst: 100}
		for i := range 30 {
			st, err := c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
			require.NoError(t, err)
			require.Equal(t, StatusCovered, st.Status)
			assert.InDelta(t, float64(i+1), st.Demand, 0.001, "take %d: each take adds n/τ to the rate", i)
		}
		// A node declaring 10 tokens/s asks for 100: the key's demand is 10 + 30 = 40 tokens/s, its
		// share floor(100·10/40 + ½) = 25, and since 40 tokens/s over the 4 s horizon exceed the
		// burst, the lower half of the burst stays in reserve: 70 tokens left, 20 above the reserve.
		// (Counting the declared demand alone, its share was the whole burst and it leased all 70.)
		n := &node{c: c, key: "k", lim: lim, inc: 1, demand: 10}
		st := n.call(t, 0, 100, 0)
		assert.EqualValues(t, 20, st.Charged, "the lease")
		assert.InDelta(t, 40, st.Demand, 0.001)
		// The rate decays with a time constant of a second: 2 s later the one-off takes count
		// 30·e⁻² ≈ 4.06 tokens/s.
		now += 2e6
		st = n.call(t, 0, 20, 0)
		assert.InDelta(t, 10+30*math.Exp(-2), st.Demand, 0.002)
	})
}
