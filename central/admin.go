package central

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/lua"
)

// peekScript reads a bucket without changing it; peek.lua documents it.
var peekScript = redis.NewScript(lua.Peek())

// Peek is a global bucket as [Client.PeekBucket] reads it.
type Peek struct {
	// Exists reports whether Redis holds the bucket; a missing bucket is full.
	Exists bool
	// Tokens is the tokens in the bucket refilled to Redis's current time, in micro-tokens (negative:
	// debt). Leases are charged when granted: tokens leased to nodes are not in it.
	Tokens int64
	// ResetAfter is the time until the bucket is full.
	ResetAfter time.Duration
}

// PeekBucket reads the global bucket of key under lim, refilled to Redis's TIME, without changing
// anything. It is bounded by ctx and FlushTimeout, and does not go through the circuit breaker
// (an administrative read, not a decision).
func (c *Client) PeekBucket(ctx context.Context, key string, lim Limit) (Peek, error) {
	if !lim.Valid() {
		return Peek{}, fmt.Errorf("%w: key %q: invalid limit rate=%v burst=%d", ErrInvalid, key, lim.Rate, lim.Burst)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	c.stats.Commands.Add(1)
	res, err := peekScript.Run(ctx, c.flushRDB, []string{BucketKey(c.cfg.Prefix, key)},
		strconv.FormatFloat(lim.Rate, 'f', -1, 64), strconv.FormatInt(lim.Burst, 10), 0).Result()
	if err != nil {
		return Peek{}, fmt.Errorf("central: peek %q: %w", key, err)
	}
	v, ok := res.([]any)
	if !ok || len(v) != 3 {
		return Peek{}, fmt.Errorf("%w: peek %q: %T", ErrBadReply, key, res)
	}
	var n [3]int64
	for i := range n {
		if n[i], ok = v[i].(int64); !ok {
			return Peek{}, fmt.Errorf("%w: peek %q: element %d is %T", ErrBadReply, key, i, v[i])
		}
	}
	return Peek{Exists: n[0] == 1, Tokens: n[1], ResetAfter: time.Duration(n[2]) * time.Microsecond}, nil
}

// DeleteBucket deletes the global bucket of key, with every node's record on it: the next call for
// it finds a full bucket. The key's ban, if any, stays (see [Client.Unban]). lim is not used (a key
// has one bucket whatever its limit). It reports whether the bucket existed. Like PeekBucket, it is
// bounded by ctx and FlushTimeout and does not go through the circuit breaker.
func (c *Client) DeleteBucket(ctx context.Context, key string, lim Limit) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	res, err := c.runner.Run(ctx, c.flushRDB, bucketBanScript, []string{BucketKey(c.cfg.Prefix, key)}, "reset", "0")
	if err != nil {
		return false, fmt.Errorf("central: delete %q: %w", key, err)
	}
	n, ok := res.(int64)
	if !ok {
		return false, fmt.Errorf("%w: delete %q: %T", ErrBadReply, key, res)
	}
	return n > 0, nil
}
