package central

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// EvictionUnsafe reports whether a Redis maxmemory-policy may evict the limiter's keys. Only
// "noeviction" is safe: every key the limiter writes carries a TTL, so the volatile-* policies
// (volatile-lru, volatile-lfu, volatile-random, volatile-ttl) can evict them as well as the
// allkeys-* ones. An evicted bucket starts full again, and an evicted ban list lifts every ban: the
// limiter silently stops limiting. (Under noeviction a full Redis refuses writes with OOM instead,
// which the limiter handles like an outage.)
func EvictionUnsafe(policy string) bool { return !strings.EqualFold(policy, "noeviction") }

// EvictionPolicy returns Redis's maxmemory-policy, read with CONFIG GET maxmemory-policy or, when
// CONFIG is not permitted (an ACL without +config|get, or a managed Redis that renames CONFIG), from
// the maxmemory_policy field of INFO memory. In a Cluster every master is asked and the first
// unsafe answer (see [EvictionUnsafe]) wins. Bounded by FlushTimeout; it bypasses the breaker.
func (c *Client) EvictionPolicy(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	if c.cluster == nil {
		return evictionPolicy(ctx, c.flushRDB)
	}
	var mu sync.Mutex
	policy := ""
	err := c.cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		p, err := evictionPolicy(ctx, node)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if policy == "" || EvictionUnsafe(p) && !EvictionUnsafe(policy) {
			policy = p
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return policy, nil
}

// evictionPolicy asks one node.
func evictionPolicy(ctx context.Context, rdb redis.Cmdable) (string, error) {
	m, cerr := rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	if cerr == nil {
		if p, ok := m["maxmemory-policy"]; ok && p != "" {
			return p, nil
		}
		cerr = fmt.Errorf("%w: CONFIG GET maxmemory-policy: %v", ErrBadReply, m)
	}
	var re redis.Error
	if !errors.As(cerr, &re) && !errors.Is(cerr, ErrBadReply) {
		return "", fmt.Errorf("central: maxmemory-policy: %w", cerr) // transport: INFO would fail too
	}
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return "", fmt.Errorf("central: maxmemory-policy: CONFIG GET: %v; INFO memory: %w", cerr, err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, "maxmemory_policy:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("%w: INFO memory has no maxmemory_policy (CONFIG GET: %v)", ErrBadReply, cerr)
}
