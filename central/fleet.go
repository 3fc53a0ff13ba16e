package central

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/lua"
)

var fleetScript = redisx.NewScript(lua.Fleet())

// Heartbeat registers this node as live for ttl (from 1ms to about 11 days) in the fleet registry
// of its prefix and returns how many nodes are live. One call, bounded by FlushTimeout; it does not
// go through the breaker (a failure counts nowhere: the caller keeps its last figure).
func (c *Client) Heartbeat(ctx context.Context, ttl time.Duration) (int64, error) {
	return c.fleetCall(ctx, "beat", ttl)
}

// Leave removes this node from the fleet registry (on Close), so that the others' count drops
// at once rather than after the heartbeat's ttl.
func (c *Client) Leave(ctx context.Context) error {
	_, err := c.fleetCall(ctx, "leave", time.Millisecond)
	return err
}

func (c *Client) fleetCall(ctx context.Context, action string, ttl time.Duration) (int64, error) {
	ms := ttl.Milliseconds()
	if ms < 1 || ms > 1e9 {
		return 0, fmt.Errorf("central: fleet ttl %v out of range [1ms, 1e9ms]", ttl)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	now := int64(0)
	if c.cfg.ScriptNow != nil {
		now = max(c.cfg.ScriptNow(), 1)
	}
	res, err := c.runner.Run(ctx, c.flushRDB, fleetScript, []string{FleetKey(c.cfg.Prefix)},
		action, c.cfg.NodeID, ms, now)
	if err != nil {
		return 0, fmt.Errorf("central: fleet %s: %w", action, err)
	}
	n, ok := res.(int64)
	if !ok {
		return 0, fmt.Errorf("central: fleet %s: unexpected reply %T", action, res)
	}
	return n, nil
}
