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
	// windowKeyMargin is how long a window's key outlives the window, for clocks of different
	// processes that disagree by less.
	windowKeyMargin = time.Second
)

// WithWindowLeases counts [UpstreamWindow] rules without strict.lua: each epoch-aligned window is a
// string key named by the window's start ("<key>:<start in µs>"), charged with INCRBY and set to
// expire after the window's end (PEXPIRE, sent once, by the call that created the key), as
// envoyproxy/ratelimit counts them. The window is decided by this process's clock ([WithClock]),
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
	entries *lru.Cache[string, *windowEntry]

	mu       sync.Mutex     // guards evicted
	evicted  []*windowEntry // evicted entries whose leases are still to give back
	nEvicted atomic.Int64   // len(evicted), read without mu on every call
}

// windowEntry is one (rule, subject)'s state in this process. Its fields are guarded by sem.
type windowEntry struct {
	sem   chan struct{} // a lock that a caller can stop waiting for
	start int64         // the window (start, µs) that count and lease describe
	count int64         // the window's count as this process knows it, without its unused lease
	lease int64         // units charged to the window in Redis and not yet used here
	since int64         // units used here since the last trip to Redis (demand)
	last  int64         // the time of the last trip to Redis, µs; 0: none yet
	used  int64         // the time of the last use here (local or a trip), µs
	idle  int64         // µs since the last trip that do not count as demand time (pauses)
	gap   int64         // the longest pause between uses that counts in full, µs; 0: any
	wkey  string        // the Redis key of the window start describes, once a trip named it
	end   int64         // the end of that window, µs
	uses  atomic.Uint32 // lookups, for entry's recency refresh (not guarded by sem)
}

// windowTouchEvery is how often (in lookups of an entry) entry moves it to the front of the LRU: a
// move takes the cache's exclusive lock, a look its shared one. An entry used less often than that
// may go out earlier than with a strict LRU; its unused lease is then given back (giveBack).
const windowTouchEvery = 16

func newWindowLeases(life time.Duration, size int) *windowLeases {
	w := &windowLeases{life: life}
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
		// A new window: what this process knew of the last one is void (its lease expired with it),
		// but the demand carries over.
		e.start, e.count, e.lease = start, 0, 0
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
		return windowResult(rule, e.count, now, end), nil
	}

	// A trip to Redis: the request's units beyond what the lease still covers, plus a new lease.
	var k int64
	if n > 0 && l.leases.life > 0 && e.last > 0 {
		// The demand is the key's while it was active here: units since the last trip over the time
		// since, less its pauses (the part of any interval between two uses beyond windowIdleGaps
		// times the interval the last lease was sized for), so that a key served in bursts gets
		// leases that last the lease life of its busy time, not of the wall clock's. It is measured
		// over at least windowDemandSpan (or a tenth of the lease life when that is shorter): units
		// that came closer together read as less demand than they are, so that a burst of two does
		// not read as a hot key; a hot key's leases grow tenfold or more per trip until they last
		// the lease life.
		elapsed := max(now-e.last-e.idle, min(l.leases.life/10, windowDemandSpan).Microseconds(), 1000) // µs
		rate := float64(e.since+n) / float64(elapsed)
		k = int64(rate * float64(l.leases.life.Microseconds()))
		left := rule.Limit - e.count - e.lease - n
		k = min(k, left/WindowLeaseShare)
		if k < 2 {
			k = 0
		}
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
		v, err := l.windowCmd(ctx, func(ctx context.Context) (int64, error) {
			return l.rdb.IncrBy(ctx, wkey, charge).Result()
		})
		if err != nil {
			// The lease is spent either way: the units may or may not have been counted.
			e.count += e.lease
			e.lease = 0
			return Decision{}, err
		}
		if v == charge {
			// This call created the window's key: it expires after the window's end.
			ttl := time.Duration(end-now)*time.Microsecond + windowKeyMargin
			if _, err := l.windowCmd(ctx, func(ctx context.Context) (int64, error) {
				return 0, l.rdb.PExpire(ctx, wkey, ttl).Err()
			}); err != nil {
				// Counted, but the key may live on: harmless to later windows (they have keys of their
				// own); the next call that finds the count at its own charge sets it again.
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
		e.lease = k
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
