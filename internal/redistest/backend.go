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
		m := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		fn(t, rdb, false)
	})
	t.Run("redis", func(t *testing.T) {
		fn(t, Start(t).Client(t), true)
	})
}
