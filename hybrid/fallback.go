package hybrid

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridrate/hybridrate/local"
)

// fallbackShare returns the number of nodes outcome.LocalFallback divides a limit by: the nodes that can be
// sharing the key now. Redis reports, with each answer for a key, the nodes that used it within the
// last ActiveWindow (10 minutes), departed processes included; the fleet registry counts the limiters
// live now (a heartbeat within its TTL, at least 15 s: FleetSize). A node that shares the key now is
// counted by both, so the smaller of the two is never below the nodes that fall back on the key
// together, and a restarted process stops counting once its heartbeat expires. Before the first
// heartbeat is answered, the key's count stands alone; for a key Redis never answered about, the
// live fleet (or, before it is known, the most nodes Redis reported on any key) is used.
func (l *Limiter) fallbackShare(e *local.Entry) int64 {
	active := l.fleetSize.Load() // 0 until the first heartbeat is answered
	if active < 1 {
		active = l.fleet.Load()
	}
	if e != nil {
		if _, a := e.Global(); a >= 1 && (a < active || l.fleetSize.Load() < 1) {
			active = a
		}
	}
	return max(active, 1)
}

// fallbackBucket is outcome.LocalFallback's bucket for one key during one outage: this node's share of the
// global bucket (Rate/A, Burst/A), enforced locally with x/time/rate. It starts from this node's share
// of what it last knew of the global bucket, not full, and it sorts its admissions into those the
// bucket's own refill during the outage pays for and those it does not (take): only the latter are
// charged to Redis as debt when it returns.
type fallbackBucket struct {
	born  int64     // l.mono() when made; an answer from Redis after it ends its outage
	start time.Time // when made, on the limiter's wall clock (l.opts.now)

	mu      sync.Mutex    // guards the fields below
	lim     *rate.Limiter // this node's share of the bucket
	s0      float64       // tokens lim started with
	r, b    float64       // lim's rate (tokens/s) and burst
	worst   float64       // the largest drawdown seen (take)
	charged int64         // tokens of its admissions charged as debt so far
}

// newFallback makes the outcome.LocalFallback bucket of a key shared by active nodes, with this node's
// rate r and burst b, at time now. It holds this node's share of the global tokens Redis last
// reported to it plus this node's share of the refill since that answer, at most b; b when Redis
// never answered this node about the key (a share of the burst, never the whole burst).
func (l *Limiter) newFallback(e *local.Entry, active int64, r float64, b int64, now time.Time) *fallbackBucket {
	s0 := float64(b)
	if e != nil {
		if at := e.GrantedAt(); at != 0 {
			g, _ := e.Global()
			s0 = min(s0, max(float64(g)/1e6/float64(active), 0)+r*float64(max(l.mono()-at, 0))/1e9)
		}
	}
	fb := &fallbackBucket{born: l.mono(), start: now, lim: rate.NewLimiter(rate.Limit(r), int(b)), r: r, b: float64(b)}
	// x/time/rate starts full and cannot be set: take what the bucket should not hold (rounded up).
	if k := int(math.Ceil(float64(b) - s0)); k > 0 {
		fb.lim.AllowN(now, k)
	}
	fb.s0 = fb.lim.TokensAt(now)
	return fb
}

// take takes n tokens at now, with the bucket's rate r and burst b (they change with the number of
// nodes sharing the key). When admitted, it returns how many of the n its refill pays for
// (excused); when denied, the time until the bucket holds n.
//
// The rule: the node is charged, over the outage, the largest drawdown its bucket showed from
// where it would stand with no admissions, min(b, s0 + r·t) after t; the rest of its admissions
// are excused. Redis refills the global bucket over the outage by itself (up to Burst, when it
// applies the first answer after it), so charging every admission as debt counted the refill that
// paid for them twice: a key that stayed under its limit came back in debt. Charged this way, the
// fleet's debt after an outage is at most the burst (each node's at most its share b), and the
// global bucket comes back holding at least what the nodes' buckets hold, no more than an exact
// bucket would after the same traffic (docs/accuracy.md).
func (fb *fallbackBucket) take(now time.Time, r float64, b, n int64) (ok bool, retry time.Duration, excused int64) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if fb.r != r || fb.b != float64(b) {
		fb.lim.SetLimitAt(now, rate.Limit(r))
		fb.lim.SetBurstAt(now, int(b))
		fb.r, fb.b = r, float64(b)
	}
	if !fb.lim.AllowN(now, int(n)) {
		// The time the bucket takes to hold n tokens, not to refill n from empty: WaitN sleeps
		// this long.
		missing := max(float64(n)-fb.lim.TokensAt(now), 0)
		return false, max(time.Duration(min(missing/r*float64(time.Second), 1<<62)), time.Microsecond), 0
	}
	idle := min(fb.b, fb.s0+fb.r*max(now.Sub(fb.start).Seconds(), 0)) // with no admissions
	fb.worst = max(fb.worst, idle-fb.lim.TokensAt(now))
	charge := min(max(int64(math.Ceil(fb.worst-1e-9))-fb.charged, 0), n)
	fb.charged += charge
	return true, 0, n - charge
}
