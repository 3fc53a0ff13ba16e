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

// TestFleetRegistry (issue 21): heartbeats count live nodes under a prefix; a node gone for longer
// than the ttl no longer counts; Leave removes a node at once; other prefixes do not count; bad
// arguments are refused with a clear error.
func TestFleetRegistry(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) {
		ctx := context.Background()
		now := t0
		clk := func() int64 { return now }
		client := func(prefix, node string) *Client {
			cfg := testConfig(rdb, node)
			cfg.Prefix, cfg.ScriptNow = prefix, clk
			c, err := New(cfg)
			require.NoError(t, err)
			return c
		}
		a, b, c := client("t", "a"), client("t", "b"), client("t", "c")
		other := client("u", "a")
		const ttl = 15 * time.Second
		for i, want := range []int64{1, 2, 3} {
			n, err := []*Client{a, b, c}[i].Heartbeat(ctx, ttl)
			require.NoError(t, err)
			assert.Equal(t, want, n)
		}
		n, err := other.Heartbeat(ctx, ttl)
		require.NoError(t, err)
		assert.EqualValues(t, 1, n, "another prefix is another fleet")

		// c stops beating: 15 s after its last heartbeat it no longer counts.
		now += 10e6
		_, err = a.Heartbeat(ctx, ttl)
		require.NoError(t, err)
		_, err = b.Heartbeat(ctx, ttl)
		require.NoError(t, err)
		now += 5e6 + 1000
		n, err = a.Heartbeat(ctx, ttl)
		require.NoError(t, err)
		assert.EqualValues(t, 2, n, "a node silent for longer than the ttl is gone")

		require.NoError(t, b.Leave(ctx))
		n, err = a.Heartbeat(ctx, ttl)
		require.NoError(t, err)
		assert.EqualValues(t, 1, n, "a node that left no longer counts")

		_, err = a.Heartbeat(ctx, 0)
		assert.ErrorContains(t, err, "fleet ttl")
		_, err = a.runner.Run(ctx, rdb, fleetScript, []string{FleetKey("t")}, "beat", "bad:id", 1000, 0)
		assert.ErrorContains(t, err, "bad node id")
		_, err = a.runner.Run(ctx, rdb, fleetScript, []string{FleetKey("t")}, "jump", "a", 1000, 0)
		assert.ErrorContains(t, err, "bad fleet action")
	})
}
