// Package every runs a function periodically until a context ends: the background loops of the
// limiter, the reloaders and the daemons (idle sweeps, heartbeats, Redis policy checks, directory
// polls, memory returns). It owns no state; each loop is the caller's goroutine.
package every

import (
	"context"
	"time"
)

// Tick calls fn every d until ctx ends, first after d (a time.Ticker: a slow fn makes the ticks it
// overran drop, not pile up). It returns when ctx ends, never while fn runs; d must be positive.
func Tick(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// Paced calls fn at once and then again after each wait fn returns, until ctx ends: a loop whose
// period depends on what fn saw (a heartbeat that slows as the fleet grows). It returns when ctx
// ends, never while fn runs; fn returns a positive wait.
func Paced(ctx context.Context, fn func() time.Duration) {
	t := time.NewTimer(fn())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			t.Reset(fn())
		}
	}
}
