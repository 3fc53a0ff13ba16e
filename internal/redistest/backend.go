package redistest

import (
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// ForEachBackend runs fn as two subtests, "miniredis" on an in-process miniredis and "redis" on a
// real redis-server (see [Start]), because gopher-lua is not Redis's Lua and only Redis 7 runs
// scripts with their "#!lua" line. real tells fn which one it runs on. The clients are closed in
// the subtests' cleanups.
func ForEachBackend(t *testing.T, fn func(t *testing.T, rdb redis.UniversalClient, real bool)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		_, rdb := Mini(t)
		fn(t, rdb, false)
	})
	t.Run("redis", func(t *testing.T) {
		fn(t, Start(t).Client(t), true)
	})
}

// Mini starts an in-process miniredis (stopped in tb.Cleanup, as by miniredis.RunT) and returns it
// with a client of it, closed in tb.Cleanup. Each opt edits the client's options.
func Mini(tb testing.TB, opt ...func(*redis.Options)) (*miniredis.Miniredis, *redis.Client) {
	tb.Helper()
	m := miniredis.RunT(tb)
	return m, newClient(tb, &redis.Options{Addr: m.Addr()}, opt)
}
