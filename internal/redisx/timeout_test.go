package redisx

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBoundCluster: a cluster client created without ContextTimeoutEnabled is replaced by a client
// of Bound's own with ContextTimeoutEnabled and socket timeouts of the bound, whose other options
// are the caller's, including the "none" values (-1) go-redis normalizes to 0 and would otherwise
// turn back into its defaults; Close closes that client only. A client created with
// ContextTimeoutEnabled is used as is. (TestHungClusterBounded in hybrid, strict, concurrency and
// policy shows the bound on a SIGSTOP'd master.)
func TestBoundCluster(t *testing.T) {
	t.Parallel()
	const timeout = 70 * time.Millisecond
	done, cancel := context.WithCancel(context.Background()) // a call on an open client fails at once
	cancel()
	for _, tc := range []struct {
		name                           string
		opt                            redis.ClusterOptions
		wantRedirects                  int
		wantMinBackoff, wantMaxBackoff time.Duration
	}{
		{"defaults", redis.ClusterOptions{}, 3, 10 * time.Millisecond, time.Second},
		{"no retries", redis.ClusterOptions{MaxRedirects: -1, MinRetryBackoff: -1, MaxRetryBackoff: -1}, 0, 0, 0},
		{"set", redis.ClusterOptions{MaxRedirects: 5, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 9 * time.Millisecond,
			ReadTimeout: -1, PoolSize: 7, Username: "u", Password: "p"}, 5, time.Millisecond, 9 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := tc.opt
			o.Addrs = []string{"127.0.0.1:1"} // never dialled
			rdb := redis.NewClusterClient(&o)
			defer rdb.Close()
			b := Bound(rdb, timeout)
			require.True(t, b.Owned)
			assert.True(t, b.Enforced)
			assert.True(t, b.HooksBypassed)
			own, ok := b.Client.(*redis.ClusterClient)
			require.True(t, ok, "%T", b.Client)
			require.NotSame(t, rdb, own)
			got := own.Options()
			assert.True(t, got.ContextTimeoutEnabled)
			assert.Equal(t, timeout, got.ReadTimeout)
			assert.Equal(t, timeout, got.WriteTimeout)
			assert.Equal(t, tc.wantRedirects, got.MaxRedirects)
			assert.Equal(t, tc.wantMinBackoff, got.MinRetryBackoff)
			assert.Equal(t, tc.wantMaxBackoff, got.MaxRetryBackoff)
			want := *rdb.Options()
			assert.Equal(t, want.MaxRedirects, got.MaxRedirects, "as the caller's client")
			assert.Equal(t, want.PoolSize, got.PoolSize)
			assert.Equal(t, want.Username, got.Username)
			assert.Equal(t, want.Password, got.Password)
			assert.Equal(t, want.Addrs, got.Addrs)
			assert.False(t, rdb.Options().ContextTimeoutEnabled, "the caller's options are not changed")

			require.NoError(t, b.Close())
			assert.ErrorIs(t, own.Ping(done).Err(), redis.ErrClosed)
			assert.ErrorIs(t, rdb.Ping(done).Err(), context.Canceled, "the caller's client is open")
		})
	}
	t.Run("context timeouts", func(t *testing.T) {
		t.Parallel()
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true})
		defer rdb.Close()
		b := Bound(rdb, timeout)
		assert.Equal(t, Bounded{Client: rdb, Enforced: true}, b)
		require.NoError(t, b.Close())
		assert.ErrorIs(t, rdb.Ping(done).Err(), context.Canceled, "the caller's client is open")
	})
}
