package central

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/internal/redisx"
)

// TestBreakerCountsRefusedNotBadKey: on a real Redis, WRONGTYPE (a per-key fault) leaves the breaker
// closed however often it happens, while OOM opens it.
func TestBreakerCountsRefusedNotBadKey(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	rdb := srv.Client(t)
	ctx := context.Background()
	c := newTestClient(t, rdb, "a")
	lim := Limit{Rate: 1, Burst: 10}
	require.NoError(t, rdb.Set(ctx, BucketKey(c.cfg.Prefix, "string"), "x", 0).Err())
	u := Update{Key: "string", Limit: lim, Inc: 1, Want: 1, N: 1}
	for range 20 {
		_, err := c.Take(ctx, u)
		require.Error(t, err)
		assert.Equal(t, redisx.ClassBadKey, redisx.Class(err), "%v", err)
		time.Sleep(5 * time.Millisecond)
	}
	assert.Equal(t, redisx.BreakerClosed, c.Breaker().State(), "WRONGTYPE does not open the breaker")

	srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
	u.Key = "fresh"
	for range 20 {
		_, err := c.Take(ctx, u)
		require.Error(t, err)
		if errors.Is(err, ErrUnavailable) {
			break
		}
		assert.Equal(t, redisx.ClassRefused, redisx.Class(err), "%v", err)
		time.Sleep(5 * time.Millisecond)
	}
	assert.Equal(t, redisx.BreakerOpen, c.Breaker().State(), "OOM opens the breaker")
}
