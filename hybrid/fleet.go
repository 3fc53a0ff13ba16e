package hybrid

import (
	"context"
	"time"

	"github.com/hybridrate/hybridrate/internal/every"
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
	// fleetQuickBeat is the period of the next heartbeat after one that found the fleet more than a
	// quarter larger than the last one did (or found it for the first time). A fleet that starts at
	// once registers one node after another: the first nodes' first heartbeats count only the nodes
	// before them, and until their next one they size what they grant themselves, and what they
	// ask Redis to lend them, for a fleet that is too small. On the fleet simulator (64 nodes, small
	// per-user bursts), nodes that counted 1 to 10 for their first 5 s held leases that the fleet's
	// real size gives nobody: 9,700 tokens were written off unused in 10 s and 3.8% of the honest
	// requests were denied (docs/benchmarks.md). A fleet that grows slowly (autoscaling) beats at
	// its usual period.
	fleetQuickBeat = 500 * time.Millisecond
)

// beatEvery returns the heartbeat period for a fleet of n live limiters.
func (l *Limiter) beatEvery(n int64) time.Duration {
	if l.fleetGrew.Load() {
		return min(fleetQuickBeat, l.opts.fleetBeat)
	}
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
	n = max(n, 1)
	prev := l.fleetSize.Swap(n)
	l.fleetGrew.Store(prev == 0 || n > prev+prev/4)
}

// watchFleet beats now and then every beatEvery (fleetBeat: tests shorten it) until ctx ends.
func (l *Limiter) watchFleet(ctx context.Context) {
	every.Paced(ctx, func() time.Duration {
		l.beat(ctx)
		return l.beatEvery(l.fleetSize.Load())
	})
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

// fleetKnown reports whether the fleet's size is known well enough to size what the node grants
// itself (coldCredit): a heartbeat has been answered, and either it found this node alone or it
// did not find the fleet more than a quarter larger than the one before (fleetGrew). A node that
// finds others at its first heartbeat, or a fleet still growing fast, waits for the next heartbeat
// (fleetQuickBeat later): in a fleet that starts at once the k-th node to register counts k, and
// credits sized for those counts added up to 1.5 to 2 bursts per key instead of one.
// The node that counts 1 grants itself at most one node's credit meanwhile.
func (l *Limiter) fleetKnown() bool {
	n := l.fleetSize.Load()
	return n == 1 || n > 1 && !l.fleetGrew.Load()
}

// Ready reports whether the limiter has finished starting: it has read the ban list once
// (BansLoaded) and knows its fleet's size (a heartbeat has been answered and found it alone, or a
// later one found the fleet no longer growing: a limiter that finds others at its first heartbeat
// waits for a second one, 500 ms later). Until then a key this limiter has not seen gets no
// cold-start credit, and its first decision goes to Redis; from then on it does, unless Redis
// holds more bans than the local copy keeps (Stats: BanListSize above Bans), which keeps new keys'
// first decisions going to Redis without making Ready false. A process that wants its first
// decisions local can wait for it before serving (a readiness check). It does no I/O.
func (l *Limiter) Ready() bool { return l.bans.known.Load() && l.fleetKnown() }

// FleetSize returns how many limiters sharing this one's key prefix were live at its last
// heartbeat (itself included), or 0 before the first answer from Redis.
func (l *Limiter) FleetSize() int64 { return l.fleetSize.Load() }
