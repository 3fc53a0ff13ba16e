package hybrid

import (
	"context"
	"time"
)

// The fleet registry (central.Heartbeat, lua/fleet.lua): every limiter says it is live every
// max(fleetBeat, fleetBeatPerNode × the fleet's size) and counts as live for three such periods
// after (at least fleetTTL), so each knows the size of its fleet (the limiters sharing its key
// prefix), and the fleet's heartbeats cost Redis at most about 100 small calls a second whatever
// its size. What a node grants itself without Redis is a fleet-wide budget divided by that count
// (coldCredit, ratesync.Credit), so the overshoot it allows does not grow with the fleet.
const (
	fleetBeat        = 5 * time.Second       // heartbeat period, at least
	fleetBeatPerNode = 10 * time.Millisecond // heartbeat period per live node, when longer
	fleetTTL         = 15 * time.Second      // a node counts as live this long after its last heartbeat, at least
)

// beatEvery returns the heartbeat period for a fleet of n live limiters.
func (l *Limiter) beatEvery(n int64) time.Duration {
	return max(l.opts.fleetBeat, time.Duration(min(n, 1<<20))*fleetBeatPerNode)
}

// fleetWatch is what the limiter knows of its fleet.
type fleetWatch struct {
	nextBeat int64 // mono time of the next heartbeat (the fleet simulator's steps)
}

// beat sends one heartbeat and records the fleet's size; a failure keeps the last size.
func (l *Limiter) beat(ctx context.Context) {
	n, err := l.central.Heartbeat(ctx, fleetTTL)
	if err != nil {
		return
	}
	l.fleetSize.Store(max(n, 1))
}

// watchFleet beats now and then every beatEvery (fleetBeat: tests shorten it) until ctx ends.
func (l *Limiter) watchFleet(ctx context.Context) {
	l.beat(ctx)
	t := time.NewTimer(l.beatEvery(l.fleetSize.Load()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			l.beat(ctx)
			t.Reset(l.beatEvery(l.fleetSize.Load()))
		}
	}
}

// stepFleet beats when one is due on the limiter's own clock: the fleet simulator's step
// (internal/virtual), which runs no goroutine.
func (l *Limiter) stepFleet(ctx context.Context) {
	now := l.mono()
	if now < l.fleetW.nextBeat {
		return
	}
	l.beat(ctx)
	l.fleetW.nextBeat = now + int64(l.beatEvery(l.fleetSize.Load()))
}

// FleetSize returns how many limiters sharing this one's key prefix were live at its last
// heartbeat (itself included), or 0 before the first answer from Redis.
func (l *Limiter) FleetSize() int64 { return l.fleetSize.Load() }
