package local

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
)

// Entry is one key's local state. Its consumption counters are cumulative for its incarnation: Redis
// applies Total-Acked, and a re-sent reconcile is recognised by the script. All methods are safe for
// concurrent use.
type Entry struct {
	// The hot path reads the first cache line (hash … used) and, for the decision's estimates, the
	// second; keep the fields in this order.
	hash    uint64
	key     string
	total   atomic.Int64  // tokens consumed by this incarnation (local admissions and granted takes)
	mark    atomic.Int64  // total may grow up to mark without asking Redis
	rate    atomic.Uint64 // math.Float64bits of the last limit's rate
	burst   atomic.Int64  // the last limit's burst
	dirty   atomic.Bool   // on the shard's dirty list
	evicted atomic.Bool   // removed from the store; see tryEvict
	used    atomic.Bool   // CLOCK reference bit

	grantBase   atomic.Int64 // Applied of the reply that set mark; written under mu
	globalMicro atomic.Int64 // global micro-tokens in the last answer
	nsPerToken  atomic.Int64 // refill time of one token at the last rate, in ns (capped)
	acked       atomic.Int64 // the part of total Redis has applied
	store       *Store
	sh          *shard
	inc         uint64
	active      atomic.Int64

	mu          sync.Mutex // serialises Grant
	resetMicros atomic.Int64
	grantedAt   atomic.Int64 // time of the last Grant, caller's monotonic clock
	next        *Entry       // dirty-list link; written only by the goroutine that set dirty
}

// Key returns the entry's key.
func (e *Entry) Key() string { return e.key }

// Incarnation returns the entry's incarnation, unique within its store.
func (e *Entry) Incarnation() uint64 { return e.inc }

// Total returns the tokens consumed by this incarnation so far.
func (e *Entry) Total() int64 { return e.total.Load() }

// Acked returns the part of Total that Redis has applied.
func (e *Entry) Acked() int64 { return e.acked.Load() }

// Mark returns the consumption up to which local takes are allowed.
func (e *Entry) Mark() int64 { return e.mark.Load() }

// Evicted reports whether the entry has left its store.
func (e *Entry) Evicted() bool { return e.evicted.Load() }

// SetLimit records the limit the key is used with; the syncer sends the latest one. It writes only
// when the limit changed.
func (e *Entry) SetLimit(rate float64, burst int64) {
	if bits := math.Float64bits(rate); e.rate.Load() != bits {
		e.rate.Store(bits)
		e.nsPerToken.Store(int64(min(1e9/rate, maxNsPerToken)))
	}
	if e.burst.Load() != burst {
		e.burst.Store(burst)
	}
}

// Limit returns the last limit set with SetLimit.
func (e *Entry) Limit() (rate float64, burst int64) {
	return math.Float64frombits(e.rate.Load()), e.burst.Load()
}

// TakeResult is the outcome of [Entry.TryTake].
type TakeResult int

// The outcomes of TryTake.
const (
	Taken   TakeResult = iota // n tokens were taken from the local allowance
	Exhaust                   // the allowance cannot cover n: ask Redis
	Gone                      // the entry was evicted concurrently: look the key up again
)

// TryTake takes n tokens from the local allowance. It never blocks, never allocates and reads no clock.
func (e *Entry) TryTake(n int64) TakeResult {
	for {
		t := e.total.Load()
		if t+n > e.mark.Load() {
			return Exhaust
		}
		if e.total.CompareAndSwap(t, t+n) {
			break
		}
	}
	// Dekker handshake with tryEvict: either the evictor sees our increment and keeps the entry, or we
	// see its flag and undo the increment. Both may happen; then we only retry.
	if e.evicted.Load() {
		e.total.Add(-n)
		return Gone
	}
	if !e.used.Load() {
		e.used.Store(true)
	}
	if !e.dirty.Load() {
		e.store.markDirty(e)
	}
	return Taken
}

// Add takes n tokens regardless of the allowance (a failure policy admitted them); they are
// reconciled with Redis like any other consumption. It returns Gone if the entry was evicted
// concurrently, in which case nothing was recorded.
func (e *Entry) Add(n int64) TakeResult {
	e.total.Add(n)
	if e.evicted.Load() {
		e.total.Add(-n)
		return Gone
	}
	e.store.markDirty(e)
	return Taken
}

// Touch sets the CLOCK reference bit, e.g. after a decision made by Redis.
func (e *Entry) Touch() {
	if !e.used.Load() {
		e.used.Store(true)
	}
}

// tryEvict marks a clean entry evicted. A clean entry has nothing pending: Redis has applied all of
// its consumption. It fails for a dirty entry or one with unapplied consumption.
func (e *Entry) tryEvict() bool {
	if e.dirty.Load() || e.total.Load() != e.acked.Load() {
		return false
	}
	e.evicted.Store(true)
	if e.dirty.Load() || e.total.Load() != e.acked.Load() {
		e.evicted.Store(false)
		return false
	}
	return true
}

// Snapshot is what a reconcile sends for an entry.
type Snapshot struct {
	Inc   uint64
	Cum   int64
	Acked int64
}

// Snapshot reads the entry's counters for a reconcile.
func (e *Entry) Snapshot() Snapshot {
	acked := e.acked.Load()
	cum := e.total.Load()
	if cum < acked { // a take granted by Redis whose reply we never saw is counted in acked only once we add it
		cum = acked
	}
	return Snapshot{Inc: e.inc, Cum: cum, Acked: acked}
}

// AddTaken records n tokens that Redis granted to this node in a synchronous take.
func (e *Entry) AddTaken(n int64) { e.total.Add(n) }

// Grant applies Redis's answer for this entry: applied is how much of the incarnation's consumption
// Redis has applied, allowance the new local allowance in tokens, global the global tokens in
// micro-tokens, active the nodes active on the key, resetMicros the time to a full bucket, and at the
// time of the answer on the caller's monotonic clock (see GrantedAt). An answer older than the one
// already applied (smaller applied) only advances acked.
//
// The mark becomes min(applied, total) + allowance: applied may already include takes of concurrent
// callers whose AddTaken has not run yet, and counting them as consumed keeps a zero allowance zero.
func (e *Entry) Grant(applied, allowance, global, active, resetMicros, at int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	total := e.total.Load()
	ack := min(applied, total)
	for {
		old := e.acked.Load()
		if ack <= old || e.acked.CompareAndSwap(old, ack) {
			break
		}
	}
	if applied < e.grantBase.Load() {
		return
	}
	e.grantBase.Store(applied)
	e.mark.Store(min(applied, total) + allowance)
	e.globalMicro.Store(global)
	e.active.Store(active)
	e.resetMicros.Store(resetMicros)
	e.grantedAt.Store(at)
}

// GrantedAt returns the time of the last answer applied with Grant, on the caller's clock; 0 if none.
func (e *Entry) GrantedAt() int64 { return e.grantedAt.Load() }

// Remaining estimates the global tokens left, in tokens: the global count at the last answer less what
// this node consumed since. Lock-free; the estimate may mix two answers.
func (e *Entry) Remaining() int64 {
	g := e.globalMicro.Load()/1_000_000 - (e.total.Load() - e.grantBase.Load())
	return max(g, 0)
}

const maxNsPerToken = 1 << 40 // about 18 minutes per token; slower rates report capped estimates

// ResetAfterNanos estimates how long, in ns, until a bucket of burst tokens with rem left is full
// again, at the rate last set with SetLimit. It uses no division, for the hot path.
func (e *Entry) ResetAfterNanos(burst, rem int64) int64 {
	missing := burst - rem
	if missing <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(missing), uint64(e.nsPerToken.Load()))
	if hi != 0 || lo > 1<<62 {
		return 1 << 62
	}
	return int64(lo)
}

// Global returns the global tokens (micro-tokens), active nodes and time to full (µs) of the last answer.
func (e *Entry) Global() (micro, active, resetMicros int64) {
	return e.globalMicro.Load(), e.active.Load(), e.resetMicros.Load()
}
