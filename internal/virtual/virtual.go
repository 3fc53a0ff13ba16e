// Package virtual lets the fleet simulator (cmd/loadgen -fleet) run hybrid limiters on simulated
// time against a real Redis: thousands of nodes, each with the real local, sync and hybrid code,
// stepped by one loop instead of thousands of timers. It holds the hooks package hybrid fills in at
// init, so that no public API of hybrid exists for it. Nothing in production uses it.
package virtual

import (
	"context"
	"time"
)

var (
	// Option returns a hybrid.Option (as any: this package cannot import hybrid) that runs a
	// limiter on the clock now: its wall and monotonic clocks and the time its Redis scripts run
	// at (instead of Redis TIME) all follow now, and it starts no background goroutine: the
	// simulator calls Step once per sync interval of simulated time. Set by package hybrid.
	Option func(now func() time.Time) any

	// Step runs one sync interval's background work of a limiter made with Option (lim is its
	// *hybrid.Limiter): the round of due reconciles that the limiter's loop runs every interval.
	// Set by package hybrid.
	Step func(ctx context.Context, lim any) error
)
