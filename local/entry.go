package local

import (
	"math"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Entry is one key's local state. Its counters are cumulative for its incarnation:
//
//   - total: tokens consumed (admitted, plus unused lease written off when the lease expired), kept
//     in the low bits of word (see takeShift);
//   - charged: tokens Redis has charged to this incarnation (leases taken in advance, and debt);
//   - mark: total may grow up to mark without asking Redis: charged plus a small overdraft credit.
//
// Consumption up to charged is paid for; beyond it, it is debt that the next reconcile reports. All
// methods are safe for concurrent use.
type Entry struct {
	// The hot path (Lookup, TryTake, Remaining) reads only the first 64 bytes, hash to remBase: one
	// cache line, as an Entry is exactly 128 bytes (a size class whose objects are 64-byte aligned;
	// TestEntryLayout pins both). docs/design.md says what each field costs.
	hash    uint32        // low 32 bits of the store's hash: shard, slot and a tag compared first
	flags   flags         // fDirty, fEvicted, fUsed, fThin, fHeld, fUnder, fFly, fWait, fSplit, lost CAS; above them, the nodes active on the key
	key     string        // compared on lookup
	word    atomic.Int64  // total (tokens consumed by this incarnation) and the decisions Store.Take counted: see takeShift
	mark    atomic.Int64  // total may grow up to mark without asking Redis
	rate    atomic.Uint64 // the limit's rate, tokens/s (float64 bits); see SetLimit
	burst   atomic.Int64  // the limit's burst
	remBase atomic.Int64  // globalMicro/1e6 + charged, kept by setRem: Remaining is remBase − total

	charged     atomic.Int64 // tokens Redis has charged to this incarnation (last answer applied)
	globalMicro atomic.Int64 // global micro-tokens in the last answer
	burned      atomic.Int64 // unused lease written off at expiry, cumulative (part of total)
	uacked      atomic.Int64 // admitted tokens Redis has counted
	// link is the owning *Store while the entry is not on a dirty list; on one, it is the next
	// *Entry of the list, or the *Store at the list's end (see markDirty and Collect). One word for
	// both, as the store is needed only to put the entry on a list.
	link  unsafe.Pointer
	rare  atomic.Pointer[rare]  // what few keys need (denials, excused tokens, one-off takes); nil until then
	calls atomic.Pointer[calls] // the state of the key's calls to Redis; nil until the first (see calls)
	inc   uint64                // guarded by the entry's lock (excused tokens start a new one: see Next)

	// The entry's mutex, which serialises Grant, Expire, Next and the other methods that change more
	// than one field, is not a field: it is one of the package's striped locks (Entry.lock), as
	// no method holds two entries' locks. The caller whose synchronous call is in flight holds
	// fFly, a flag bit (Fly).
}

// calls is the part of an entry's state that its calls to Redis keep: allocated by the first
// method that records one (Seen, Next, Grant) and kept for the entry's life. Until then each of its
// values reads as zero. Fields without an atomic type are guarded by the entry's lock.
//
// seq and applied are 32 bits, compared modulo 2^32 (seqBefore): an answer is ordered against the
// calls of its incarnation correctly as long as fewer than 2^31 calls of one key are issued
// while it is in flight (a call is bounded by its timeout).
type calls struct {
	grantedAt  atomic.Int64 // time of the last answer applied, caller's monotonic clock; 0 if none
	leaseUntil atomic.Int64 // the unused lease may be used until then (caller's clock)
	demand     float64      // estimated demand on this node, tokens/s (admitted + denied)
	sentUsed   int64        // used (admitted) tokens at the last call
	sentAt     int64        // time of the last call (caller's clock); before the first call, minus the time the syncer first saw the entry
	seq        uint32       // last call number issued (modulo 2^32)
	applied    uint32       // call number of the last answer applied (modulo 2^32)
}

// noCalls is what an entry without a calls part reads: all zero. Never written.
var noCalls calls

// peek returns e's calls part, or noCalls (read only) when it has none yet.
func (e *Entry) peek() *calls {
	if c := e.calls.Load(); c != nil {
		return c
	}
	return &noCalls
}

// record returns e's calls part, allocating it the first time; e's lock must be held.
func (e *Entry) record() *calls {
	c := e.calls.Load()
	if c == nil {
		c = new(calls)
		e.calls.Store(c)
	}
	return c
}

// seqBefore reports whether call number a was issued before b, modulo 2^32.
func seqBefore(a, b uint32) bool { return int32(a-b) < 0 }

// stripe is one of the locks entries share (Entry.lock): mu is the mutex of each entry mapped to
// it, and cond is what callers waiting for such an entry's call in flight sleep on (Fly).
type stripe struct {
	_    [(64 - (unsafe.Sizeof(sync.Mutex{})+unsafe.Sizeof(sync.Cond{}))%64) % 64]byte // a whole number of cache lines (first: a zero-size last field would add a word)
	mu   sync.Mutex
	cond sync.Cond
}

// stripeBits sets the number of stripes: 1,024 (64 KB), so that two entries busy at once rarely
// share one.
const stripeBits = 10

// stripes are the locks every entry of the process maps to (Entry.lock), each cond on its own mu.
var stripes = func() *[1 << stripeBits]stripe {
	s := new([1 << stripeBits]stripe)
	for i := range s {
		s[i].cond.L = &s[i].mu
	}
	return s
}()

// acquire locks e's mutex (its stripe's) and returns it.
func (e *Entry) acquire() *sync.Mutex {
	m := &e.lock().mu
	m.Lock()
	return m
}

// lock returns e's stripe, chosen by its hash (set before the entry is published, never changed).
func (e *Entry) lock() *stripe { return &stripes[(e.hash*0x9e3779b1)>>(32-stripeBits)] }

// rare is the part of an entry's state that most keys never need, allocated by the first method
// that does (Entry.more) and kept for the entry's life: a key that was denied locally, had
// tokens excused, sent one-off takes, waited for another caller's call, or was told to retry later.
// Until then each of its values reads as zero. Fields without an atomic type are guarded by the
// entry's lock.
type rare struct {
	denied     atomic.Int64          // tokens this node denied locally (demand it could not serve), cumulative
	waiters    atomic.Int64          // tokens the callers waiting for the call in flight want
	retryAt    atomic.Int64          // a lease shorter than wanted: do not ask again before then (caller's clock)
	sentDenied int64                 // denied tokens at the last call
	excused    int64                 // tokens AddExcused excused that Redis has not been told of
	directAt   int64                 // start of the window Direct counts in (caller's clock); 0 before the first
	split      atomic.Pointer[split] // a contended key's allowance split per core (see split); set before fSplit
	exSeq      uint32                // the first call that left them out of its Cum (modulo 2^32, as calls.seq)
	directN    int16                 // one-off takes counted in Direct's window
	thinRun    uint8                 // synchronous answers in a row that SetThin recorded as thin
}

// more returns e's rare part, allocating it the first time.
func (e *Entry) more() *rare {
	if r := e.rare.Load(); r != nil {
		return r
	}
	r := new(rare)
	if e.rare.CompareAndSwap(nil, r) {
		return r
	}
	return e.rare.Load()
}

// The bits of Entry.flags. Each is set and cleared by an atomic Or or And on the word, so that the
// nine need 4 bytes of the hot cache line, not 24, and TryTake reads all three it needs at once.
// The word's bits from activeShift up hold the number of nodes active on the key by the last
// answer (Global), written by Grant with a CAS that leaves the flag bits as they are.
const (
	fDirty   uint32 = 1 << iota // on the shard's dirty list
	fEvicted                    // removed from the store; see tryEvict
	fUsed                       // CLOCK reference bit
	fThin                       // the last synchronous answer left nothing beyond its request (see Thin)
	fHeld                       // Store.Take leaves the entry alone: the caller must check it elsewhere first (see Store.Hold)
	fUnder                      // the last answer counted the key's demand under its rate (see Under)
	fFly                        // a caller's synchronous call is in flight (see Fly)
	fWait                       // a caller waits for it on the entry's stripe (see Fly)
	fSplit                      // the allowance is split per core: rare.split is set (see split)

	// Bits 9–11 count the CAS a take lost on the entry's word (Store.contended) since the count
	// was last reset (every 256th decision and every Collect): at splitAfter the entry is split.
	lostShift   = 9
	lostOne     = 1 << lostShift
	lostMask    = 7 << lostShift
	activeShift = 12
	maxActive   = 1<<(32-activeShift) - 1 // 1,048,575 nodes: more than any fleet's
)

// An entry's word holds two counts that Store.Take updates with one CAS: total, the tokens
// consumed, in its low takeShift bits, and in the bits above them the decisions Store.Take
// admitted that the store has not added to Stats.Taken yet, modulo 2^(64−takeShift). The store
// adds them (Store.fold) when the syncer collects the entry (Collect: every entry Take counted on
// is on a dirty list, as a take puts it there), when the entry leaves the store, and, for a busy
// entry between two collections, at every 256th decision (the take that wraps the count adds 256).
// So a local decision costs no locked instruction beyond the take's own CAS, and Stats.Taken
// lags the decisions by at most what one collection folds, and loses none.
//
// total stays far below 2^takeShift: central refuses a cumulative count above 2^53 (the scripts'
// exact integers), so an entry never reports such a total, and 2^56 tokens take more than two
// years at the largest rate (1e9 a second).
const (
	takeShift = 56
	tokenMask = 1<<takeShift - 1 // total's bits
	oneTake   = 1 << takeShift   // one decision in the count (as int64 arithmetic wraps, the count wraps mod 256)
	takeWrap  = 1 << (64 - takeShift)
)

// tot returns the total held in a word.
func tot(w int64) int64 { return w & tokenMask }

// takes returns the decision count held in a word.
func takes(w int64) int64 { return int64(uint64(w) >> takeShift) }

// flags is a word of independent bits, each updated atomically.
type flags struct{ v atomic.Uint32 }

func (f *flags) has(bit uint32) bool { return f.v.Load()&bit != 0 }
func (f *flags) set(bit uint32)      { f.v.Or(bit) }
func (f *flags) clear(bit uint32)    { f.v.And(^bit) }

// setOnce sets bit and reports whether it was clear.
func (f *flags) setOnce(bit uint32) bool { return f.v.Or(bit)&bit == 0 }

// active returns the count kept above the flag bits.
func (f *flags) active() int64 { return int64(f.v.Load() >> activeShift) }

// setActive replaces the count kept above the flag bits with n, capped at maxActive.
func (f *flags) setActive(n int64) {
	a := uint32(min(max(n, 0), maxActive)) << activeShift
	for {
		old := f.v.Load()
		if f.v.CompareAndSwap(old, old&(1<<activeShift-1)|a) {
			return
		}
	}
}

// setRem refreshes remBase after charged or globalMicro changed; e's lock must be held (or e not yet
// published).
func (e *Entry) setRem() { e.remBase.Store(e.globalMicro.Load()/1_000_000 + e.charged.Load()) }

// Key returns the entry's key.
func (e *Entry) Key() string { return e.key }

// Limit returns the entry's limit: the last one [Entry.SetLimit] set.
func (e *Entry) Limit() (rate float64, burst int64) {
	return math.Float64frombits(e.rate.Load()), e.burst.Load()
}

// HasLimit reports whether the entry's limit is (rate, burst). Lock-free, for the hot path.
func (e *Entry) HasLimit(rate float64, burst int64) bool {
	return e.rate.Load() == math.Float64bits(rate) && e.burst.Load() == burst
}

// SetLimit changes the entry's limit. The entry keeps everything else: its incarnation, lease,
// credit and counters. The lease was charged to the key's one bucket in Redis (the limit is not
// part of its name), so using it under the new limit grants nothing twice; the new limit sizes the
// next calls to Redis, which clamp the bucket to the new burst and refill it at the new rate. A
// reader racing with SetLimit may see the new rate with the old burst for an instant (both valid).
func (e *Entry) SetLimit(rate float64, burst int64) {
	e.rate.Store(math.Float64bits(rate))
	e.burst.Store(burst)
}

// incarnations numbers the entries' incarnations, for every store of the process: unique, and
// later ones larger, within each store as Redis's node records need them.
var incarnations atomic.Uint64

// Incarnation returns the entry's incarnation, unique within its process.
func (e *Entry) Incarnation() uint64 {
	defer e.acquire().Unlock()
	return e.inc
}

// Total returns the tokens consumed by this incarnation so far: admitted, and written off. For a
// split entry (see split) it takes the entry's lock, and the tokens moved to its slots and not
// admitted are not counted.
func (e *Entry) Total() int64 {
	if e.flags.v.Load()&fSplit == 0 {
		return tot(e.word.Load())
	}
	defer e.acquire().Unlock()
	return e.total()
}

// Charged returns the tokens Redis has charged to this incarnation, by the last answer applied.
func (e *Entry) Charged() int64 { return e.charged.Load() }

// Mark returns the consumption up to which local takes are allowed.
func (e *Entry) Mark() int64 { return e.mark.Load() }

// Evicted reports whether the entry has left its store.
func (e *Entry) Evicted() bool { return e.flags.has(fEvicted) }

// Held reports whether the entry is held ([Store.Hold]).
func (e *Entry) Held() bool { return e.flags.has(fHeld) }

// TakeResult is the outcome of [Entry.TryTake].
type TakeResult int

// The outcomes of TryTake.
const (
	Taken   TakeResult = iota // n tokens were taken from the local allowance
	Exhaust                   // the allowance cannot cover n
	Gone                      // the entry was evicted concurrently: look the key up again
)

// TryTake takes n tokens from the local allowance. It never blocks, never allocates and reads no
// clock. It does not count a decision (Store.Take does; the caller counts its own).
func (e *Entry) TryTake(n int64) TakeResult {
	reclaimed := false
	for {
		w := e.word.Load()
		if tot(w)+n > e.mark.Load() {
			if !reclaimed && e.flags.has(fSplit) {
				// The slots may hold what is missing: bring it back and look again, once.
				reclaimed = true
				mu := e.acquire()
				e.drainLocked()
				mu.Unlock()
				continue
			}
			return Exhaust
		}
		if e.word.CompareAndSwap(w, w+n) {
			break
		}
	}
	// Dekker handshake with tryEvict: either the evictor sees our increment and keeps the entry, or we
	// see its flag and undo the increment. Both may happen; then we only retry.
	f := e.flags.v.Load()
	if f&fEvicted != 0 {
		e.word.Add(-n)
		return Gone
	}
	if f&fUsed == 0 {
		e.flags.set(fUsed)
	}
	if f&fDirty == 0 {
		e.markDirty()
	}
	return Taken
}

// Add takes n tokens regardless of the allowance (a failure policy admitted them); they are
// reconciled with Redis like any other consumption. It returns Gone if the entry was evicted
// concurrently, in which case nothing was recorded.
func (e *Entry) Add(n int64) TakeResult {
	e.word.Add(n)
	if e.flags.has(fEvicted) {
		e.word.Add(-n)
		return Gone
	}
	e.markDirty()
	return Taken
}

// AddExcused is Add for tokens a failure policy admitted of which excused are paid for already
// (0 ≤ excused ≤ n): all n are consumption, reported to Redis as admitted, but only n − excused are
// charged as debt. hybrid's LocalFallback excuses what its share of the bucket's own refill during
// an outage covers (docs/accuracy.md). Like Add, it returns Gone, recording nothing, if the entry was
// evicted concurrently.
//
// Redis charges a node's consumption beyond the charge in its record of the node's incarnation,
// and a call of the same incarnation cannot lower what Redis charges; a new incarnation's record is
// seeded from the charge the node sends (Call.Acked). So the calls after AddExcused leave the
// excused tokens out of their Cum (and Used) until one of them is answered, which tells the node
// what Redis has charged it (leases granted by calls it gave up on during the outage included), and
// the next call starts a new incarnation that sends that charge plus the excused tokens as Acked and
// its whole consumption as Cum and Used (Next).
func (e *Entry) AddExcused(n, excused int64) TakeResult {
	excused = min(max(excused, 0), n)
	defer e.acquire().Unlock()
	e.word.Add(n)
	if e.flags.has(fEvicted) {
		e.word.Add(-n)
		return Gone
	}
	if excused > 0 {
		r := e.more()
		if r.excused == 0 {
			r.exSeq = e.peek().seq + 1
		}
		r.excused += excused
	}
	e.markDirty()
	return Taken
}

// Refund gives back up to n tokens this incarnation admitted (a caller that took them and did not
// use them): its consumption goes down, so the tokens can be taken again by TryTake. They stay
// charged to this node, as part of its lease (or as debt not incurred), which is exact under the
// cumulative protocol: the next call reports the lower consumption, and Redis, which keeps the
// largest counts it was sent, neither charges nor counts anything twice. A refund into a lease
// whose life has ended (now ≥ LeaseUntil, caller's monotonic clock) writes those tokens off at once,
// as Expire would. Refund never gives back more than the incarnation admitted and did not write
// off; it returns the tokens it gave back, 0 if the entry was evicted.
func (e *Entry) Refund(n, now int64) int64 {
	if n <= 0 {
		return 0
	}
	defer e.acquire().Unlock()
	e.drainLocked()
	for {
		if e.flags.has(fEvicted) {
			return 0
		}
		w := e.word.Load()
		t := tot(w)
		k := min(n, t-e.burned.Load())
		if k <= 0 {
			return 0
		}
		nt := t - k
		burn := int64(0)
		if now >= e.LeaseUntil() {
			burn = max(min(t, e.charged.Load())-nt, 0) // refunded into an expired lease: written off
		}
		if !e.word.CompareAndSwap(w, w+(nt+burn-t)) {
			continue // a concurrent take: look again
		}
		e.burned.Add(burn)
		if e.flags.has(fEvicted) {
			// Evicted meanwhile (see TryTake): the entry is gone; the refund is lost with it, which
			// never over-admits.
			return 0
		}
		e.markDirty()
		return k
	}
}

// Deny records n tokens of demand this node denied locally, so that the next call asks for a lease
// sized to the demand, and puts the entry on the dirty list.
func (e *Entry) Deny(n int64) {
	e.more().denied.Add(n)
	if !e.flags.has(fUsed) {
		e.flags.set(fUsed)
	}
	e.markDirty()
}

// Fly makes the caller the one whose synchronous call for the entry is in flight, and reports true;
// the caller must call Land when its call is answered. When another call is already in flight, Fly
// registers n tokens of demand for it, waits until it is answered (a call is bounded by its
// timeout), and reports false: the caller should then look at the renewed allowance. One call at a
// time per key keeps concurrent callers from sending calls that Redis would see as stale.
func (e *Entry) Fly(n int64) bool {
	if e.flags.setOnce(fFly) {
		return true
	}
	r := e.more()
	r.waiters.Add(n)
	l := e.lock()
	l.mu.Lock()
	// fWait is set under the stripe's mutex before fFly is read again: a Land that clears fFly
	// after this read sees fWait and broadcasts once this caller sleeps (Wait releases the mutex).
	for e.flags.v.Or(fWait)&fFly != 0 {
		l.cond.Wait()
	}
	l.mu.Unlock()
	r.waiters.Add(-n)
	return false
}

// Land ends the caller's call in flight (see Fly) and wakes the callers waiting for it.
func (e *Entry) Land() {
	if e.flags.v.And(^(fFly|fWait))&fWait != 0 {
		l := e.lock()
		l.mu.Lock()
		l.cond.Broadcast()
		l.mu.Unlock()
	}
}

// Waiters returns the tokens callers waiting for the call in flight want.
func (e *Entry) Waiters() int64 {
	if r := e.rare.Load(); r != nil {
		return r.waiters.Load()
	}
	return 0
}

// Touch sets the CLOCK reference bit, e.g. after a decision made by Redis.
func (e *Entry) Touch() {
	if !e.flags.has(fUsed) {
		e.flags.set(fUsed)
	}
}

// tryEvict marks an entry evicted when Redis has counted all of its consumption (no debt, and every
// admitted token reported) and it is not on a dirty list. An unused lease is given up.
func (e *Entry) tryEvict() bool {
	if e.flags.has(fSplit) {
		// Under the entry's lock no slot is refilled: the drain leaves total exact, and a slot take
		// that raced with it sees fEvicted and gives its tokens back (Store.afterSlot).
		defer e.acquire().Unlock()
		e.drainLocked()
	}
	if !e.clean() {
		return false
	}
	e.flags.set(fEvicted)
	if !e.clean() {
		e.flags.clear(fEvicted)
		return false
	}
	return true
}

// clean reports whether Redis has counted all of e's consumption and e is not on a dirty list.
func (e *Entry) clean() bool {
	if e.flags.has(fDirty) {
		return false
	}
	burned := e.burned.Load() // before total: Expire raises total first, so a race reads used too high
	t := e.total()
	return t <= e.charged.Load() && t-burned <= e.uacked.Load()
}

// Pending reports whether the entry has consumption Redis has not charged (debt to report).
func (e *Entry) Pending() bool { return e.total() > e.charged.Load() }

// Unused returns the unused part of the lease, in tokens.
func (e *Entry) Unused() int64 { return max(e.charged.Load()-e.total(), 0) }

// Call is what one reconcile sends for an entry; see central.Update.
type Call struct {
	Inc    uint64
	Seq    uint64 // the call's number within the incarnation, for ordering answers (not sent)
	Cum    int64
	Acked  int64
	Used   int64
	UAcked int64
	Demand float64 // tokens/s, admitted and denied, on this node
	Active bool    // the entry admitted or denied anything since the last call
}

// Next numbers a new call and reads the counters to send, at time now (caller's monotonic clock, ns).
// It updates the demand estimate (see demandTau): admitted and denied tokens since the last call
// over the time since, weighted against the previous estimate by an exponential decay; the first
// estimate counts from the time the syncer first saw the entry, over at least one second.
func (e *Entry) Next(now int64) Call {
	defer e.acquire().Unlock()
	k := e.record()
	k.seq++
	e.drainLocked() // what the slots hold and did not admit comes back: total is then exact
	total := tot(e.word.Load())
	cum := total
	r := e.rare.Load()
	if r != nil && r.excused > 0 {
		if !seqBefore(k.applied, r.exSeq) {
			// An answer since the tokens were excused gave the charge Redis holds: a new
			// incarnation's record starts from it plus the excused tokens (AddExcused). Later calls of
			// the old incarnation are stale.
			e.inc = incarnations.Add(1)
			e.charged.Add(r.excused)
			e.setRem()
			r.excused = 0
		} else {
			cum -= r.excused
		}
	}
	used := total - e.burned.Load()
	den := int64(0) // from r, loaded once: a Deny that allocates the rare part now counts next time
	if r != nil {
		den = r.denied.Load()
	}
	got := e.sinceCall(k, used, den)
	active := got > 0
	if k.sentAt <= 0 {
		born := -k.sentAt
		if born == 0 {
			born = now
		}
		life := float64(max(now-born, int64(1e9))) / 1e9
		if got < demandEvents {
			k.demand = youngDemand(got, life)
		} else {
			k.demand = got / life
		}
	} else {
		dt := float64(max(now-k.sentAt, 1)) / 1e9
		if seen := float64(k.sentUsed + e.sentDenied()); seen+got < demandEvents {
			// Young: the mean rate since the first request (youngDemand). The time since then is
			// not stored: the estimate so far gives it back (count ÷ rate); with nothing seen
			// before this call, it counts from the last call, over at least a second.
			life := max(dt, 1)
			if seen > 0 && k.demand > 0 {
				life = youngLife(seen, k.demand) + dt
			}
			k.demand = youngDemand(seen+got, life)
		} else {
			// An exponentially weighted rate over irregular intervals: the observation got/dt
			// weighs 1 − e^(−dt/τ), so a call soon after the last (one request in 20 ms) moves the
			// estimate by got/τ, not by got/dt.
			rate := got / dt
			obs := got / max(dt, 1) // for τ, a few requests in a short time count over a second
			reliable := got >= demandReliable
			if reliable {
				rate = got / max(dt, 0.1) // a burst within a few ms is not a rate of thousands a second
				obs = rate
			}
			keep := math.Exp(-dt / demandTau(k.demand, obs))
			if reliable {
				keep = min(keep, 0.5) // at least half the weight
			}
			k.demand = k.demand*keep + rate*(1-keep)
		}
	}
	k.demand = min(k.demand, maxDemand) // a burst in a short window must not exceed what Redis accepts
	k.sentUsed, k.sentAt = used, now
	if r != nil {
		r.sentDenied = den
	}
	return Call{
		Inc: e.inc, Seq: uint64(k.seq), Cum: cum, Acked: e.charged.Load(), Used: min(used, cum), UAcked: e.uacked.Load(),
		Demand: k.demand, Active: active,
	}
}

// RecentRate returns the tokens admitted and denied since the entry's last call, per second over the
// time since that call (at least a second), at time now (caller's monotonic clock, ns); -1 before the
// first call. Unlike Demand, it reacts at once to a key that went quiet: one request in the 14 s
// since the last call reads 0.07/s whatever the estimate says.
func (e *Entry) RecentRate(now int64) float64 {
	defer e.acquire().Unlock()
	k := e.peek()
	if k.sentAt <= 0 {
		return -1
	}
	return e.sinceCall(k, e.total()-e.burned.Load(), e.Denied()) / max(float64(now-k.sentAt)/1e9, 1)
}

// sinceCall returns the tokens admitted and denied since the last call, given the counters now:
// used (admitted, less what was written off) and den (denied), and k, e's calls part; e's lock must
// be held.
func (e *Entry) sinceCall(k *calls, used, den int64) float64 {
	return float64(max(used-k.sentUsed, 0) + den - e.sentDenied()) // used falls after a Refund
}

// Seen notes the first time the syncer sees the entry, for the first demand estimate.
func (e *Entry) Seen(now int64) {
	defer e.acquire().Unlock()
	if c := e.record(); c.sentAt == 0 && now > 0 {
		c.sentAt = -now
	}
}

// Direct counts a decision this node sent to Redis as a one-off take (nothing leased; Redis counted
// it at once, so it is not part of the entry's consumption), at time now (caller's monotonic
// clock, ns), and returns how many it has counted in the current window of the given length, this
// one included. The first take after a window ended starts a new one.
func (e *Entry) Direct(now, window int64) int64 {
	defer e.acquire().Unlock()
	r := e.more()
	if r.directAt == 0 || now-r.directAt > window {
		r.directAt, r.directN = now, 0
	}
	if r.directN < math.MaxInt16 {
		r.directN++
	}
	return int64(r.directN)
}

// DirectRate returns the rate of the one-off takes Direct counted in its current window, per
// second over the time since the window began (at least a second), at time now; 0 when the window
// has ended or none was counted.
func (e *Entry) DirectRate(now, window int64) float64 {
	defer e.acquire().Unlock()
	r := e.rare.Load()
	if r == nil || r.directAt == 0 || now-r.directAt > window {
		return 0
	}
	return float64(r.directN) / max(float64(now-r.directAt)/1e9, 1)
}

// SetThin records whether the last synchronous call's answer left this node anything beyond the
// request it was made for (a lease, or credit): the caller's decision of its next call (hybrid's
// direct rule).
func (e *Entry) SetThin(v bool) {
	defer e.acquire().Unlock()
	if v {
		e.flags.set(fThin)
		if r := e.more(); r.thinRun < maxThinRun {
			r.thinRun++
		}
	} else {
		e.flags.clear(fThin)
		if r := e.rare.Load(); r != nil {
			r.thinRun = 0
		}
	}
}

// maxThinRun caps ThinRun.
const maxThinRun = 16

// Thin reports what SetThin recorded last.
func (e *Entry) Thin() bool { return e.flags.has(fThin) }

// ThinRun returns how many synchronous answers in a row SetThin recorded as thin (at most 16): 0
// after an answer that left this node something beyond its request, or before any answer.
func (e *Entry) ThinRun() int {
	defer e.acquire().Unlock()
	if r := e.rare.Load(); r != nil {
		return int(r.thinRun)
	}
	return 0
}

// Active reports whether the entry admitted or denied anything since its last call.
func (e *Entry) Active() bool {
	defer e.acquire().Unlock()
	return e.total()-e.burned.Load() != e.peek().sentUsed || e.Denied() != e.sentDenied()
}

// Unreported reports whether the entry admitted tokens Redis has not counted yet.
func (e *Entry) Unreported() bool {
	burned := e.burned.Load()
	return e.total()-burned > e.uacked.Load()
}

// Demand returns the entry's demand estimate, tokens/s.
func (e *Entry) Demand() float64 {
	defer e.acquire().Unlock()
	return e.peek().demand
}

// Answer is Redis's answer to a call, as [Entry.Grant] applies it.
type Answer struct {
	Seq        uint64 // the number of the call answered (Call.Seq)
	Stale      bool   // the call was not applied (a late call of a replaced incarnation)
	Charged    int64  // tokens charged to the incarnation
	Global     int64  // global micro-tokens
	Active     int64  // nodes active on the key
	SentUsed   int64  // the call's Used (Redis has counted it unless Stale)
	SentCum    int64  // the call's Cum
	Credit     int64  // overdraft allowed beyond Charged
	At         int64  // time of the answer (caller's clock)
	LeaseUntil int64  // the unused lease may be used until then
	RetryAt    int64  // do not ask for more before then
	Under      bool   // the key's demand, as Redis counted it, is under its rate
}

// Grant applies an answer. An answer older than the one already applied (smaller Seq) is ignored.
// The mark becomes Charged + Credit: consumption since the call (debt not yet reported) counts
// against the new credit.
func (e *Entry) Grant(a Answer) {
	defer e.acquire().Unlock()
	k, seq := e.peek(), uint32(a.Seq)
	if a.Stale || seqBefore(seq, k.applied) || seqBefore(k.seq, seq) {
		return
	}
	k = e.record()
	k.applied = seq
	e.drainLocked() // tokens moved to slots under the old mark come back before the new one applies
	if a.Charged > e.charged.Load() {
		e.charged.Store(a.Charged)
	}
	if a.SentUsed > e.uacked.Load() {
		e.uacked.Store(a.SentUsed)
	}
	e.mark.Store(e.charged.Load() + a.Credit)
	e.globalMicro.Store(a.Global)
	e.setRem()
	e.flags.setActive(a.Active)
	if a.Under {
		e.flags.set(fUnder)
	} else {
		e.flags.clear(fUnder)
	}
	k.grantedAt.Store(a.At)
	k.leaseUntil.Store(a.LeaseUntil)
	if r := e.rare.Load(); r != nil || a.RetryAt != 0 {
		if r == nil {
			r = e.more()
		}
		r.retryAt.Store(a.RetryAt)
	}
	if r := e.rare.Load(); r != nil && r.excused > 0 && !seqBefore(k.applied, r.exSeq) {
		e.markDirty() // the next call tells Redis of the excused tokens (Next): soon, and at Close
	}
}

// Expire writes off the unused lease once its time has passed (now ≥ LeaseUntil): total is raised
// to charged, so those tokens can never be admitted, and the credit above charged stays. It reports
// the tokens written off.
func (e *Entry) Expire(now int64) int64 {
	defer e.acquire().Unlock()
	if now < e.LeaseUntil() {
		return 0
	}
	e.drainLocked()
	c := e.charged.Load()
	for {
		w := e.word.Load()
		t := tot(w)
		if t >= c {
			return 0
		}
		if e.word.CompareAndSwap(w, w+(c-t)) {
			e.burned.Add(c - t)
			return c - t
		}
	}
}

// GrantedAt returns the time of the last answer applied with Grant, on the caller's clock; 0 if none.
func (e *Entry) GrantedAt() int64 { return e.peek().grantedAt.Load() }

// LeaseUntil returns the time until which the unused lease may be used (caller's clock).
func (e *Entry) LeaseUntil() int64 { return e.peek().leaseUntil.Load() }

// RetryAt returns the time before which the node should not ask for more (caller's clock).
func (e *Entry) RetryAt() int64 {
	if r := e.rare.Load(); r != nil {
		return r.retryAt.Load()
	}
	return 0
}

// Under reports whether the last answer counted the key's demand, over all its nodes, under its
// rate: then a bucket it found empty is held by leases, not by the key's own load.
func (e *Entry) Under() bool { return e.flags.has(fUnder) }

// RefillAt returns when, by the last answer, the global bucket holds n tokens again (caller's clock):
// the answer's time plus the refill the missing tokens take at the entry's rate; the answer's time
// when it already held them.
func (e *Entry) RefillAt(n int64) int64 {
	at, g := e.GrantedAt(), e.globalMicro.Load()
	if g >= n*1_000_000 {
		return at
	}
	rate, _ := e.Limit()
	return at + int64(min(float64(n*1_000_000-g)/rate*1e3, 1<<62))
}

// refillNanos returns the time, in ns, the entry's bucket takes to refill from empty: Burst/Rate.
func (e *Entry) refillNanos() int64 {
	rate, burst := e.Limit()
	return int64(min(float64(burst)/rate*1e9, 1<<62))
}

// Denied returns the tokens this node denied locally so far.
func (e *Entry) Denied() int64 {
	if r := e.rare.Load(); r != nil {
		return r.denied.Load()
	}
	return 0
}

// sentDenied returns the denied tokens at the last call; e's lock must be held.
func (e *Entry) sentDenied() int64 {
	if r := e.rare.Load(); r != nil {
		return r.sentDenied
	}
	return 0
}

// Burned returns the unused lease written off so far, in tokens.
func (e *Entry) Burned() int64 { return e.burned.Load() }

// Remaining estimates the global tokens left, in tokens: the global count at the last answer plus
// this node's unused lease. Lock-free; the estimate may mix two answers. On a split entry (see
// [Entry.Split]) the tokens its slots hold count as spent, so the estimate is low by those: a
// refill moves at most 1/(2·slots) of the allowance left to a slot, so about half of it at most.
// Reading every slot, which the other cores write, would cost each decision that reads it what the
// split saved.
func (e *Entry) Remaining() int64 {
	return max(e.remBase.Load()-tot(e.word.Load()), 0)
}

// demandTau returns the time constant (s) of a node's demand estimate, from the estimate so far and
// the rate just observed: long enough that it spans about demandEvents requests, from minDemandTau
// to maxDemandTau. A key this node sees a few times a second is estimated over many seconds; an
// observation of demandReliable requests or more also gets at least half the weight (Next), so a
// key turning hot is followed within about a second.
//
// Why: with the previous rule (each call's observation blended half and half with the estimate),
// one request followed by a call 50 ms later read as 20 requests/s, and a Zipf key at 1.25
// requests/s per node was estimated at 5–25/s. That inflated leases (stranded at the node while
// other nodes starved) and the key's demand in Redis (no lease advance, no reserve). A key at 0.9×
// its rate across 8 nodes lost about 3% of the requests an exact bucket admits; loadgen's zipf
// scenario's false denials were 1.38%, now 0.6–0.7% (docs/benchmarks.md).
func demandTau(est, obs float64) float64 {
	return min(max(demandEvents/max(est, obs, 1e-9), minDemandTau), maxDemandTau)
}

// youngDemand is the demand estimate of an entry that has seen fewer than demandEvents requests:
// seen requests (admitted and denied) over life seconds since the syncer first saw the entry, not
// counting the first request, which is what made the entry exist (counting it reads a key seen
// once a second and then every 2.3 s as 1/s, not 0.44/s); at least half a request over life once
// one is seen, 0 before.
//
// Why: the exponential estimate (demandTau) starts from its first observation and, for a key a node
// sees less than twice a second, forgets it over 16 s. On the fleet simulator (8 nodes, 3,000 keys
// at 0.7× a limit of 5/s, burst 10), the nodes' estimates were about twice the truth after 10 s:
// leases twice as large, the key's demand read as over its rate, no reserve kept, and 1.15% of
// the requests an exact bucket admits denied; with the mean, 0.29%. A Zipf key over its rate, first
// seen once, was read as under it for seconds and lent the coming refill (worst key 1.067 of its
// allowance in 10 s; with the mean, 1.050): docs/benchmarks.md.
func youngDemand(seen, life float64) float64 {
	if seen < 1 {
		return 0
	}
	return max(seen-1, 0.5) / life
}

// youngLife inverts youngDemand: the life that gives demand for seen requests.
func youngLife(seen, demand float64) float64 { return max(seen-1, 0.5) / demand }

// The parameters of the demand estimate (see demandTau).
const (
	demandEvents = 32
	// demandReliable is how many requests since the last call make their rate over that time
	// trustworthy: fewer count over at least a second when τ is chosen.
	demandReliable = 8
	minDemandTau   = 0.25 // s
	maxDemandTau   = 16.0 // s
)

// maxDemand caps the demand estimate, tokens/s: the scripts accept at most 1e9 (the largest rate).
const maxDemand = 1e9

// Global returns the global tokens (micro-tokens) and the nodes sharing the key, by the last answer.
func (e *Entry) Global() (micro, active int64) {
	return e.globalMicro.Load(), e.flags.active()
}
