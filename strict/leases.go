package strict

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/internal/redisx"
)

// Window leases: UpstreamWindow rules counted as envoyproxy/ratelimit counts them (a string key per
// epoch-aligned window, INCRBY), with a lease of the window's quota held in this process so that
// most calls never reach Redis. docs/sidecar.md ("Local-first windows") and docs/accuracy.md
// ("Leased upstream windows") give the design and its bounds.

// Bounds of window leases.
const (
	// MaxWindowLeaseKeys is the most (rule, subject) pairs whose lease state a Limiter keeps; the
	// least recently used goes first (recency as of a pair's first use and every 16th use after
	// it), and its unused lease is given back to Redis (DECRBY) by the
	// call that evicted it. Should that fail, the lease stays counted in Redis until its window ends:
	// processes then see that many units fewer than upstream would.
	MaxWindowLeaseKeys = 1 << 16
	// WindowLeaseShare is the largest fraction of a window's remaining quota (as this process last
	// knew it) one lease may take: 1/WindowLeaseShare. A key with fewer than 2·WindowLeaseShare units
	// left is counted exactly, one INCRBY per call.
	WindowLeaseShare = 16
	// windowDemandSpan is the shortest time a key's demand is measured over (see leased).
	windowDemandSpan = 100 * time.Millisecond
	// windowIdleGaps is how many times the interval between uses that a key's lease was sized for
	// (lease life ÷ lease) a pause between two uses may last and still count as demand time; the
	// rest of a longer pause is idle time, left out of the demand (see leased). With uses at random
	// (Poisson) times at the demand the lease assumed, about 2% of the time falls beyond 4 such
	// intervals, so a steady key's demand reads about 2% high.
	windowIdleGaps = 4
	// windowRenewAt is the fraction of its last lease (1/windowRenewAt) below which a key's lease
	// is renewed ahead of need, in the background, batched with other keys' renewals.
	windowRenewAt = 4
	// windowRenewEvery is the longest time a renewal waits to be sent, so that renewals due about
	// the same time share one pipeline (a tenth of the lease life when that is shorter).
	windowRenewEvery = 100 * time.Millisecond
	// windowKeyMargin is how long a window's key outlives the window, for clocks of different
	// processes that disagree by less.
	windowKeyMargin = time.Second
)

// WithWindowLeases counts [UpstreamWindow] rules without strict.lua: each epoch-aligned window is a
// string key named by the window's start ("<key>:<start in µs>"), charged with INCRBY and set to
// expire after the window's end (PEXPIRE, sent with this process's first charge of the window in
// one pipeline, and by a later call that finds it created the key), as envoyproxy/ratelimit counts
// them. The window is decided by this process's clock ([WithClock]),
// as upstream decides it, not by Redis TIME.
//
// With life > 0, a call that reaches Redis also takes a lease of the window: k more units, charged
// to the window's count at once, which the process then admits locally, without Redis, until they
// run out. k is the key's demand while active (the units it used since this process's last trip to
// Redis, over the time since less its pauses, or over 100ms (life/10 if shorter) when that is
// longer) times life, at most 1/[WindowLeaseShare] of what the window had left: a pause is the part
// of an interval between two uses of the key beyond 4 times the interval its last lease was sized
// for (life/k), so a key served in bursts gets leases that last life of its busy time. A key close
// to its limit gets no lease and is counted exactly. A lease never takes the count above the limit (a lease that
// would is given back at once, DECRBY), so no process admits more than upstream would, and a single
// process answers exactly as upstream: every code, remaining count and reset. Several processes
// may refuse early by at most the leases the others hold unused, and answer remaining counts that
// differ from upstream's by as much (docs/accuracy.md).
//
// A lease that falls below a quarter of its size is renewed ahead of need: topped up to what the
// key's demand asks for then, by a goroutine of the Limiter's that sends every due key's INCRBY in
// one pipeline within 100ms (life/10 if shorter) and ends when none is due; the key's next call
// adds the units that landed. A call whose lease runs short first takes its queued renewal back and
// goes to Redis itself, or waits for one already sent. [Limiter.Close] sends what is due and waits
// for the goroutine.
//
// With life = 0 there are no leases: one INCRBY per call (and one PEXPIRE per window and key).
// life must not be negative. Under this option, a call that mixes UpstreamWindow rules with rules
// of other algorithms is refused ([ErrInvalid]): their counts would not be atomic together.
func WithWindowLeases(life time.Duration) Option {
	return optionFunc(func(o *options) error {
		if life < 0 {
			return fmt.Errorf("%w: window lease life %v: want 0 or more", ErrInvalid, life)
		}
		o.leases, o.leaseLife = true, life
		return nil
	})
}

// windowLeases holds the lease state of UpstreamWindow keys.
type windowLeases struct {
	life    time.Duration
	every   time.Duration // how long due renewals wait to be sent together (windowRenewEvery)
	entries *lru.Cache[string, *windowEntry]

	mu       sync.Mutex       // guards evicted, due, renewing and closed
	evicted  []*windowEntry   // evicted entries whose leases are still to give back
	nEvicted atomic.Int64     // len(evicted), read without mu on every call
	due      []*windowRenewal // renewals to send
	renewing bool             // a renewer goroutine runs (renewDue)
	closed   bool             // Close was called: no renewer starts
	stop     chan struct{}    // closed by Close: the renewer sends what is due now and ends
	wg       sync.WaitGroup   // the renewer
}

// windowRenewal is one key's lease renewal, sent ahead of need by renewDue. The fields above done
// are set before it is queued and not changed after; v, returned and err are set by the renewer
// before it closes done.
type windowRenewal struct {
	wkey  string // the window's key
	start int64  // the window
	end   int64  // the window's end, µs
	k     int64  // the units to charge
	limit int64  // the rule's limit: a renewal that takes the count above it is given back
	next  bool   // a lease of the next window, taken ahead (takeNext)
	done  chan struct{}

	sent      bool // taken by the renewer to send; guarded by windowLeases.mu
	cancelled bool // taken back before it was sent (cancel); guarded by windowLeases.mu

	v        int64 // the count after the charge
	returned bool  // the renewal went back (DECRBY): it took the count above the limit
	err      error // the charge may or may not have been counted
}

// windowEntry is one (rule, subject)'s state in this process. Its fields are guarded by sem.
type windowEntry struct {
	sem   chan struct{}  // a lock that a caller can stop waiting for
	start int64          // the window (start, µs) that count and lease describe
	count int64          // the window's count as this process knows it, without its unused lease
	lease int64          // units charged to the window in Redis and not yet used here
	since int64          // units used here since the last trip to Redis (demand)
	last  int64          // the time of the last trip to Redis, µs; 0: none yet
	used  int64          // the time of the last use here (local or a trip), µs
	idle  int64          // µs since the last trip that do not count as demand time (pauses)
	gap   int64          // the longest pause between uses that counts in full, µs; 0: any
	size  int64          // the lease's size when last taken or topped up (renewal's low-water mark)
	renew *windowRenewal // the renewal in flight, if any
	next  *windowRenewal // the next window's lease, taken ahead (takeNext), if any
	wkey  string         // the Redis key of the window start describes, once a trip named it
	end   int64          // the end of that window, µs
	uses  atomic.Uint32  // lookups, for entry's recency refresh (not guarded by sem)
}

// windowTouchEvery is how often (in lookups of an entry) entry moves it to the front of the LRU: a
// move takes the cache's exclusive lock, a look its shared one. An entry used less often than that
// may go out earlier than with a strict LRU; its unused lease is then given back (giveBack).
const windowTouchEvery = 16

func newWindowLeases(life time.Duration, size int) *windowLeases {
	w := &windowLeases{life: life, every: min(windowRenewEvery, life/10), stop: make(chan struct{})}
	w.entries, _ = lru.NewWithEvict(size, func(_ string, e *windowEntry) {
		w.mu.Lock()
		w.evicted = append(w.evicted, e)
		w.nEvicted.Store(int64(len(w.evicted)))
		w.mu.Unlock()
	})
	return w
}

// giveBack returns the unused leases of evicted entries to Redis, so that the units they held are
// counted by no one (the entries are gone; their leases would otherwise sit in Redis to the
// window's end). It runs on the call that evicted them.
func (l *Limiter) giveBack(ctx context.Context) {
	w := l.leases
	w.mu.Lock()
	ev := w.evicted
	w.evicted = nil
	w.nEvicted.Store(0)
	w.mu.Unlock()
	for _, e := range ev {
		select {
		case e.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		if r := e.renew; r != nil && w.cancel(r) {
			e.renew = nil // not sent: nothing to give back for it
		}
		if r := e.next; r != nil && w.cancel(r) {
			e.next = nil // the next window's lease, not sent (a sent one stays counted there)
		}
		if !e.settle(ctx) { // sent: its units land before they go back
			<-e.sem
			return
		}
		k, wkey, end := e.lease, e.wkey, e.end
		e.lease = 0
		<-e.sem
		now := l.opts.now().UnixMicro()
		if k <= 0 || end <= now {
			continue // nothing held, or its window is over and its key expiring
		}
		ttl := time.Duration(end-now)*time.Microsecond + windowKeyMargin
		_, _ = l.windowCmd(ctx, func(ctx context.Context) (int64, error) {
			// With PEXPIRE, a key that expired meanwhile is not left behind at -k forever.
			_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.DecrBy(ctx, wkey, k)
				p.PExpire(ctx, wkey, ttl)
				return nil
			})
			return 0, err
		})
	}
}

// entry returns key's state, creating it. It marks the entry as recently used every
// windowTouchEvery lookups.
func (w *windowLeases) entry(key string) *windowEntry {
	if e, ok := w.entries.Peek(key); ok {
		if e.uses.Add(1)%windowTouchEvery == 0 {
			w.entries.Get(key)
		}
		return e
	}
	e := &windowEntry{sem: make(chan struct{}, 1)}
	if prev, found, _ := w.entries.PeekOrAdd(key, e); found {
		return prev
	}
	return e
}

// evaluateLeased answers checks, all of them UpstreamWindow rules, one after the other: each counts
// its N whatever the others answer (as strict.lua counts them), so the call is their conjunction.
func (l *Limiter) evaluateLeased(ctx context.Context, tag, htag string, checks []Check, out []Decision) (bool, time.Duration, error) {
	allowed := true
	var retry time.Duration
	for i, c := range checks {
		subj := htag
		if c.Subject != tag {
			subj = l.hashed(c.Subject)
		}
		base := key(l.opts.prefix, htag, c.Rule.Name, "uwc", subj)
		r, err := l.leased(ctx, base, c.Rule, c.N)
		if err != nil {
			return false, 0, fmt.Errorf("strict: %s on %q: %w", c.Rule.Name, htag, err)
		}
		out[i] = r
		if !r.Allowed {
			allowed = false
			retry = max(retry, r.RetryAfter)
		}
	}
	if !allowed {
		l.stats.Denied.Add(1)
	}
	return allowed, retry, nil
}

// leased charges n to rule's current window for the counter whose keys start with base: from the
// lease when it covers n, else in Redis (taking a new lease when the key's demand asks for one).
func (l *Limiter) leased(ctx context.Context, base string, rule Rule, n int64) (Decision, error) {
	e := l.leases.entry(base)
	if l.leases.nEvicted.Load() > 0 {
		l.giveBack(ctx)
	}
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return Decision{}, ctx.Err()
	}
	defer func() { <-e.sem }()

	now := l.opts.now().UnixMicro()
	period := rule.Period.Microseconds()
	start := now - now%period
	if e.start != start {
		// A new window: what this process knew of the last one is void (its lease expired with it,
		// and so will a renewal of it in flight), but the demand carries over. A lease of this
		// window taken ahead (takeNext) becomes the renewal in flight: it names the window's key,
		// and its units join the lease once it landed (fold).
		nx := e.next
		e.start, e.count, e.lease, e.renew, e.next = start, 0, 0, nil, nil
		if nx != nil && nx.start == start {
			e.renew, e.wkey, e.end, e.size = nx, nx.wkey, nx.end, nx.k
		}
	}
	if r := e.renew; r != nil {
		select {
		case <-r.done:
			e.fold(r)
		default:
		}
	}
	end := start + period
	if e.gap > 0 && e.used > 0 && now-e.used > e.gap {
		e.idle += now - e.used - e.gap // a pause: the key was idle here, not slow
	}
	e.used = now
	if n > 0 && n <= e.lease || n == 0 && e.lease > 0 {
		// Served locally: a check of n = 0 too, when this process holds a lease (its count is then
		// the window's as far as any process here knows it, and below the limit).
		e.lease -= n
		e.count += n
		e.since += n
		l.stats.LeaseHits.Add(1)
		if e.lease*windowRenewAt < e.size && e.renew == nil {
			l.renewAhead(e, rule, now, end)
		}
		if e.next == nil && end-now <= l.leases.ahead(period) {
			l.takeNext(e, base, rule, now, end)
		}
		return windowResult(rule, e.count, now, end), nil
	}
	if r := e.renew; r != nil && l.leases.cancel(r) {
		e.renew = nil // not sent yet: this trip takes the lease instead
	}
	if e.renew != nil {
		// A renewal is in flight: wait for it (the count after this trip must know whether Redis
		// counted it), then serve from it if it covers n.
		if !e.settle(ctx) {
			return Decision{}, ctx.Err()
		}
		if n > 0 && n <= e.lease || n == 0 && e.lease > 0 {
			e.lease -= n
			e.count += n
			e.since += n
			l.stats.LeaseHits.Add(1)
			return windowResult(rule, e.count, now, end), nil
		}
	}

	// A trip to Redis: the request's units beyond what the lease still covers, plus a new lease.
	var k int64
	if n > 0 && e.last > 0 {
		k = l.leaseSize(e, rule, now, n)
	}
	wkey := base + ":" + strconv.FormatInt(start, 10)
	var count int64
	if n == 0 {
		v, err := l.windowCmd(ctx, func(ctx context.Context) (int64, error) {
			v, err := l.rdb.Get(ctx, wkey).Int64()
			if errors.Is(err, redis.Nil) {
				return 0, nil
			}
			return v, err
		})
		if err != nil {
			return Decision{}, err
		}
		count = v
	} else {
		charge := n - e.lease + k // the unused lease pays for part of n
		ttl := time.Duration(end-now)*time.Microsecond + windowKeyMargin
		// This process's first charge of a window sends the key's expiry with it, in one round trip:
		// the key is then most often new (every key of a window is created by some process's first
		// charge of it), and a key another process created gets the same expiry again, as upstream
		// sends EXPIRE with every INCRBY.
		first := e.wkey != wkey
		expFailed := false
		v, err := l.windowCmd(ctx, func(ctx context.Context) (int64, error) {
			if !first {
				return l.rdb.IncrBy(ctx, wkey, charge).Result()
			}
			l.stats.Calls.Add(1) // windowCmd counted one command
			var incr *redis.IntCmd
			var exp *redis.BoolCmd
			_, _ = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				incr = p.IncrBy(ctx, wkey, charge)
				exp = p.PExpire(ctx, wkey, ttl)
				return nil
			})
			if err := incr.Err(); err != nil {
				return 0, err
			}
			if err := exp.Err(); err != nil {
				expFailed = true
				return incr.Val(), err
			}
			return incr.Val(), nil
		})
		if err != nil && expFailed {
			// Counted, but the key may live on: harmless to later windows (they have keys of their
			// own); the next call that finds the count at its own charge sets it again.
			e.count, e.lease = v-k, 0
			return Decision{}, err
		}
		if err != nil {
			// The lease is spent either way: the units may or may not have been counted.
			e.count += e.lease
			e.lease = 0
			return Decision{}, err
		}
		if v == charge && !first {
			// This call created the window's key (it had expired or been deleted since this
			// process's first charge of the window): it expires after the window's end.
			if _, err := l.windowCmd(ctx, func(ctx context.Context) (int64, error) {
				return 0, l.rdb.PExpire(ctx, wkey, ttl).Err()
			}); err != nil {
				e.count, e.lease = v-k, 0
				return Decision{}, err
			}
		}
		e.since, e.last, e.idle, e.gap = 0, now, 0, 0
		if k > 0 && v > rule.Limit {
			// The lease would cross the limit (other processes counted meanwhile): give it back.
			if _, err := l.windowCmd(ctx, func(ctx context.Context) (int64, error) {
				return l.rdb.DecrBy(ctx, wkey, k).Result()
			}); err != nil {
				e.count, e.lease = v-k, 0
				return Decision{}, err
			}
			v -= k
			k = 0
		}
		count = v - k
		e.lease, e.size = k, k
		if k > 0 {
			// The lease is sized for a use every life/k: a pause of more than windowIdleGaps of
			// those is idle time.
			e.gap = windowIdleGaps * l.leases.life.Microseconds() / k
		}
		e.wkey, e.end = wkey, end
	}
	if n == 0 && e.last == 0 {
		e.last = now // a read starts the demand's clock as a charge does
	}
	e.count = count
	return windowResult(rule, count, now, end), nil
}

// windowResult is UpstreamWindow's answer for a window (ending at end) whose count, this request
// included, is count.
func windowResult(rule Rule, count, now, end int64) Decision {
	r := Decision{Allowed: count <= rule.Limit, Limit: rule.Limit}
	if count > 0 {
		r.ResetAfter = time.Duration(end-now) * time.Microsecond
	}
	if r.Allowed {
		r.Remaining = rule.Limit - count
	} else {
		r.Excess = count - rule.Limit
		r.RetryAfter = time.Duration(end-now) * time.Microsecond
	}
	return r
}

// windowCmd runs one command of a window lease with the breaker and the timeout, as call runs a
// script.
func (l *Limiter) windowCmd(ctx context.Context, f func(context.Context) (int64, error)) (int64, error) {
	if !l.guard.Allow() {
		l.stats.Rejected.Add(1)
		return 0, redisx.ErrBreakerOpen
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, l.opts.timeout)
	defer cancel()
	l.stats.Calls.Add(1)
	v, err := f(ctx)
	if err != nil {
		l.stats.Errors.Add(1)
	}
	l.guard.Done(caller, err)
	if err != nil && redisx.IsTransport(err) {
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return v, err
}

// leaseSize is the lease a trip to Redis (or a renewal, n = 0) of e at now should take, on top of
// the n units it charges: the key's demand while it was active here (units since the last trip
// over the time since, less its pauses: the part of any interval between two uses beyond
// windowIdleGaps times the interval the last lease was sized for) times the lease life, so that a
// key served in bursts gets leases that last the lease life of its busy time, not of the wall
// clock's. The demand is measured over at least windowDemandSpan (or a tenth of the lease life when
// that is shorter): units that came closer together read as less demand than they are, so that a
// burst of two does not read as a hot key; a hot key's leases grow tenfold or more per trip until
// they last the lease life. At most 1/WindowLeaseShare of what the window has left besides e's
// lease and n; 0 below 2 units. e.sem is held.
func (l *Limiter) leaseSize(e *windowEntry, rule Rule, now, n int64) int64 {
	if l.leases.life <= 0 {
		return 0
	}
	k := int64(l.demand(e, now, n) * float64(l.leases.life.Microseconds()))
	left := rule.Limit - e.count - e.lease - n
	k = min(k, left/WindowLeaseShare)
	if k < 2 {
		return 0
	}
	return k
}

// demand is e's demand at now, units per µs, with n more units used now: see leaseSize. e.sem is
// held.
func (l *Limiter) demand(e *windowEntry, now, n int64) float64 {
	elapsed := max(now-e.last-e.idle, min(l.leases.life/10, windowDemandSpan).Microseconds(), 1000) // µs
	return float64(e.since+n) / float64(elapsed)
}

// renewAhead queues a renewal of e's lease, which has fallen below 1/windowRenewAt of its size: a
// top-up to the lease the key's demand asks for now (leaseSize; none when that is not 2 units more
// than e holds), charged to the window's key by the renewer (renewDue) with the other keys' due
// renewals in one pipeline, and added to e's lease by e's next call after it lands (fold). So a key
// with a steady demand is served from its lease without waiting for Redis, and Redis sees one
// pipeline for many keys' renewals. e.sem is held; the trip that took the lease named the window's
// key (e.wkey) for this window.
func (l *Limiter) renewAhead(e *windowEntry, rule Rule, now, end int64) {
	w := l.leases
	if e.wkey == "" || e.end != end || e.last == 0 {
		return // the lease was taken in another window, or never: a trip names this one
	}
	k := l.leaseSize(e, rule, now, 0) - e.lease
	if k < 2 {
		return
	}
	r := &windowRenewal{wkey: e.wkey, start: e.start, end: end, k: k, limit: rule.Limit, done: make(chan struct{})}
	if !l.queue(r) {
		return
	}
	// The demand is measured afresh from here, as after a trip; the lease is sized for k more.
	e.renew = r
	e.since, e.last, e.idle = 0, now, 0
	e.size = e.lease + k
	e.gap = windowIdleGaps * w.life.Microseconds() / e.size
}

// queue adds r to the renewals the renewer sends next, starting the renewer if none runs, and
// reports whether it did (not after Close).
func (l *Limiter) queue(r *windowRenewal) bool {
	w := l.leases
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.due = append(w.due, r)
	if !w.renewing {
		w.renewing = true
		w.wg.Add(1)
		go l.renewDue()
	}
	return true
}

// ahead is how long before a window's end a key served from a lease takes the next window's lease
// (takeNext): long enough for the renewer to send it (it waits up to w.every) and for Redis to
// answer before the window turns, at most a quarter of the window.
func (w *windowLeases) ahead(period int64) int64 {
	return min(period/4, (2*w.every + 50*time.Millisecond).Microseconds())
}

// takeNext queues a lease of the window after e's (from end on) in the renewer's next pipeline, so
// that the key's first call of that window is served from it rather than waiting for Redis: sized as
// a renewal is (the key's demand while active times the lease life), but for at most the window's
// length (a lease that outlasts its window is counted there and never used), and at most
// 1/WindowLeaseShare of the window's limit; none under 2 units. A window's key is named by its
// start, so the INCRBY counts in the next window only; the renewer sets its expiry when the charge created it and gives
// the units back when they took the count above the limit, as for any renewal. If the key is not
// used in that window, the lease is counted and unused, as a lease that a process holds when its
// traffic stops is: other processes may refuse early by at most that much (docs/accuracy.md). An
// entry evicted before its window gives back what the current window holds only; the next
// window's lease, if sent, stays counted. e.sem is held; e was served from its lease at now, in
// the window ending at end.
func (l *Limiter) takeNext(e *windowEntry, base string, rule Rule, now, end int64) {
	w := l.leases
	if e.last == 0 {
		return
	}
	period := rule.Period.Microseconds()
	k := min(int64(l.demand(e, now, 0)*float64(min(w.life.Microseconds(), period))), rule.Limit/WindowLeaseShare)
	if k < 2 {
		return
	}
	r := &windowRenewal{wkey: base + ":" + strconv.FormatInt(end, 10), start: end, end: end + period, k: k,
		limit: rule.Limit, next: true, done: make(chan struct{})}
	if !l.queue(r) {
		return
	}
	e.next = r
}

// settle waits for e's renewal in flight, if any, and folds it into e's state. It returns false
// when ctx ended first. e.sem is held.
func (e *windowEntry) settle(ctx context.Context) bool {
	r := e.renew
	if r == nil {
		return true
	}
	select {
	case <-r.done:
		e.fold(r)
		return true
	case <-ctx.Done():
		return false
	}
}

// fold applies a renewal that landed to e: its units join the lease (unless they went back), and
// the count is the window's as Redis answered it, less e's unused lease. A renewal that failed may
// or may not have been counted: its units are then lost to this window (fewer admitted, never
// more). e.sem is held and r.done closed.
func (e *windowEntry) fold(r *windowRenewal) {
	e.renew = nil
	if r.err != nil || r.start != e.start {
		return
	}
	// Redis's count after the charge held every unit this process charged in this window: those it
	// used (e.count then), its lease then, and r.k. Units used since moved from the lease to e.count.
	e.count = r.v - r.k - e.lease
	if !r.returned {
		e.lease += r.k
	}
}

// renewDue sends the due renewals, every w.every (at once after Close), in one pipeline per batch,
// until none is due. It runs on a goroutine of its own, started by renewAhead, and Close waits for
// it.
func (l *Limiter) renewDue() {
	w := l.leases
	defer w.wg.Done()
	t := time.NewTimer(w.every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-w.stop:
		}
		w.mu.Lock()
		due := w.due[:0:0]
		for _, r := range w.due {
			if !r.cancelled {
				r.sent = true
				due = append(due, r)
			}
		}
		w.due = nil
		if len(due) == 0 {
			w.renewing = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		l.sendRenewals(due)
		for _, r := range due {
			close(r.done)
		}
		t.Reset(w.every)
	}
}

// sendRenewals charges the renewals in one pipeline of INCRBY, then, in a second one when needed,
// sets the expiry of a window key a renewal created (PEXPIRE) and gives back the renewals that took
// a count above its limit (DECRBY). It sets each renewal's v, returned and err.
func (l *Limiter) sendRenewals(due []*windowRenewal) {
	ctx := context.Background()
	cmds := make([]*redis.IntCmd, len(due))
	_, err := l.windowCmd(ctx, func(ctx context.Context) (int64, error) {
		l.stats.Calls.Add(int64(len(due) - 1)) // windowCmd counted one command
		_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, r := range due {
				cmds[i] = p.IncrBy(ctx, r.wkey, r.k)
			}
			return nil
		})
		return 0, err
	})
	var fix []*windowRenewal
	now := l.opts.now().UnixMicro()
	for i, r := range due {
		if r.v, r.err = cmds[i].Result(); r.err == nil {
			r.err = err
		}
		if r.err == nil && (r.v == r.k || r.v > r.limit) {
			fix = append(fix, r)
		}
	}
	if len(fix) == 0 {
		return
	}
	_, err = l.windowCmd(ctx, func(ctx context.Context) (int64, error) {
		l.stats.Calls.Add(int64(len(fix) - 1))
		_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, r := range fix {
				if r.v > r.limit {
					p.DecrBy(ctx, r.wkey, r.k)
				} else {
					// The key had expired or been deleted: it expires after the window's end.
					p.PExpire(ctx, r.wkey, time.Duration(max(r.end-now, 0))*time.Microsecond+windowKeyMargin)
				}
			}
			return nil
		})
		return 0, err
	})
	for _, r := range fix {
		if r.v > r.limit {
			r.returned = err == nil
			if err != nil {
				r.err = err // the lease may be counted in Redis, and would cross the limit: not used
			}
		}
	}
}

// cancel takes r back if the renewer has not taken it to send yet, and reports whether it did.
func (w *windowLeases) cancel(r *windowRenewal) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.sent {
		return false
	}
	r.cancelled = true
	return true
}

// close stops the renewals: the renewer sends what is due at once and ends, and close waits for
// it; no renewal is queued after it. Leases of windows still to come (takeNext) not sent yet are
// dropped: a closed Limiter would not use them.
func (w *windowLeases) close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		for _, r := range w.due {
			if r.next && !r.sent {
				r.cancelled = true
			}
		}
		close(w.stop)
	}
	w.mu.Unlock()
	w.wg.Wait()
}
