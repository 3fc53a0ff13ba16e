package central

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBanChangeLogAndPagedReads(t *testing.T) {
	forEachClient(t, "a", func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, c *Client) {
		_, _, start, err := c.ScanBans(ctx, "0", 10)
		require.NoError(t, err)
		for i := range 25 {
			require.NoError(t, c.Ban(ctx, "k"+strconv.Itoa(i), time.Hour))
		}
		require.NoError(t, c.Unban(ctx, "k3"))

		// A full scan, page by page.
		var keys []string
		for cursor, first := "0", true; first || cursor != "0"; first = false {
			var page []BanEvent
			page, cursor, _, err = c.ScanBans(ctx, cursor, 5)
			require.NoError(t, err)
			for _, ev := range page {
				assert.True(t, ev.Banned)
				assert.InDelta(t, time.Hour.Seconds(), ev.TTL.Seconds(), 5)
				keys = append(keys, ev.Key)
			}
		}
		slices.Sort(keys)
		keys = slices.Compact(keys)
		assert.Len(t, keys, 24)
		assert.NotContains(t, keys, "k3")

		// The change log, from before the first ban, in pages of 10.
		seen := map[string]BanEvent{}
		cur := BanCursor{Since: start}
		for pages := 0; ; pages++ {
			require.Less(t, pages, 10)
			ch, err := c.BanChangesSince(ctx, cur, 10)
			require.NoError(t, err)
			require.False(t, ch.Reload)
			assert.EqualValues(t, 24, ch.Total)
			for _, ev := range ch.Events {
				seen[ev.Key] = ev
			}
			cur = ch.Next
			if !ch.More {
				break
			}
		}
		assert.Len(t, seen, 25)
		assert.False(t, seen["k3"].Banned, "the unban is in the log")
		assert.True(t, seen["k4"].Banned)
		// The changes of the millisecond a read ended are read again (never skipped); once past
		// it, nothing is new.
		time.Sleep(5 * time.Millisecond)
		ch, err := c.BanChangesSince(ctx, cur, 100)
		require.NoError(t, err)
		for _, ev := range ch.Events {
			prev, ok := seen[ev.Key]
			assert.True(t, ok && prev.Banned == ev.Banned, "%v: a repeat of a change already read", ev)
		}
		ch, err = c.BanChangesSince(ctx, ch.Next, 100)
		require.NoError(t, err)
		assert.Empty(t, ch.Events, "nothing new")

		ch, err = c.BanChangesSince(ctx, BanCursor{Since: start - 11*60*1000}, 10)
		require.NoError(t, err)
		assert.True(t, ch.Reload, "older than the log keeps")
		assert.Empty(t, ch.Events)

		rem, err := c.BannedKeys(ctx, []string{"k1", "k3", "nobody"})
		require.NoError(t, err)
		assert.InDelta(t, time.Hour.Seconds(), rem[0].Seconds(), 5)
		assert.Zero(t, rem[1])
		assert.Zero(t, rem[2])
		_, err = c.BannedKeys(ctx, make([]string, MaxBanCheck+1))
		assert.ErrorIs(t, err, ErrInvalid)

		// A scan page removes the expired entries it meets (the sweep of WatchBans).
		require.NoError(t, c.Ban(ctx, "brief", time.Millisecond))
		time.Sleep(20 * time.Millisecond)
		for cursor, first := "0", true; first || cursor != "0"; first = false {
			_, cursor, _, err = c.ScanBans(ctx, cursor, 100)
			require.NoError(t, err)
		}
		ok, err := rdb.HExists(ctx, BansKey(c.cfg.Prefix), "brief").Result()
		require.NoError(t, err)
		assert.False(t, ok, "the expired ban was removed")
	})
}
