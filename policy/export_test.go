package policy

import (
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
)

// CountHybridLimiters counts the hybrid limiters Enforcers create from now until the test ends. It
// replaces a package variable: call it only from tests that do not run in parallel.
func CountHybridLimiters(t testing.TB) *atomic.Int64 {
	var n atomic.Int64
	prev := newHybrid
	newHybrid = func(rdb redis.UniversalClient, opts ...hybrid.Option) (*hybrid.Limiter, error) {
		n.Add(1)
		return prev(rdb, opts...)
	}
	t.Cleanup(func() { newHybrid = prev })
	return &n
}
