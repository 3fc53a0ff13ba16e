package concurrency

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/outcome"
)

// Errors returned by the Limiter. A full key is not an error: see [Lease.Acquired].
var (
	// ErrInvalidKey is wrapped by the error for an empty key or one longer than MaxKeyLen.
	ErrInvalidKey = errors.New("concurrency: invalid key")
	// ErrInvalidLimit is wrapped by the error for a limit below 1 or above MaxLimit.
	ErrInvalidLimit = errors.New("concurrency: invalid limit")
	// ErrInvalidTTL is wrapped by the error for a lease TTL that is not positive or exceeds MaxTTL.
	ErrInvalidTTL = errors.New("concurrency: invalid ttl")
	// ErrClosed is returned by TryAcquire and Acquire after Close.
	ErrClosed = errors.New("concurrency: limiter closed")
	// ErrUnavailable is wrapped by the errors of the calls that cannot fall back on a failure policy
	// ([Lease.Release], [Lease.Extend], [Limiter.InFlight]) when Redis could not serve them. It is
	// the same value as hybrid.ErrUnavailable and strict.ErrUnavailable.
	ErrUnavailable = redisx.ErrUnavailable
)

// Stats is a snapshot of what a [Limiter] did, from [Limiter.Stats]. Every count only grows over the
// Limiter's life. The zero Stats counts nothing; it is a plain value, safe to copy.
type Stats struct {
	Acquired      int64 // leases granted (by Redis or a failure policy)
	Denied        int64 // TryAcquire calls that found their key full (or failed closed)
	Fallbacks     int64 // decisions made by the failure policy
	RedisErrors   int64 // Redis calls that failed (transport, refusal, bad key, bad reply)
	ReleaseErrors int64 // releases that could not reach Redis (the slot returns at its TTL)
}

// counters are the live counts behind [Stats].
type counters struct {
	Acquired      atomic.Int64
	Denied        atomic.Int64
	Fallbacks     atomic.Int64
	RedisErrors   atomic.Int64
	ReleaseErrors atomic.Int64
}

// Limiter limits how many leases — requests in flight, jobs running — each key may hold at once
// across every node that shares a Redis. Each lease is an entry in a Redis sorted set per key, with an
// expiry on Redis's clock: a holder that dies without releasing gives its slot back after the TTL.
// Every TryAcquire, Release and Extend is one Redis round trip (see the package documentation for
// why there is no local-first mode).
//
// Create a Limiter with [New]; the zero Limiter is not usable. A Limiter is safe for concurrent use.
// Most callers want [Limiter.TryAcquire] and a deferred [Lease.Release].
type Limiter struct {
	rdb     redis.UniversalClient // the caller's client bounded by WithTimeout (bounded)
	owned   bool                  // rdb is a client of our own, which Close closes
	cleanup runtime.Cleanup       // closes an rdb of our own if the Limiter is dropped without Close
	o       options
	guard   *redisx.Guard // the breaker in front of rdb
	runner  redisx.Runner // runs concurrency.lua
	fb      fallback
	stats   counters
	tag     string        // this Limiter's random lease-id prefix
	seq     atomic.Uint64 // lease numbers
	closed  atomic.Bool

	releaseLog logEvery // release failures: at most one line per logInterval

	mu      sync.Mutex          // guards held and sweepAt
	held    map[*Lease]heldInfo // Redis leases not yet released, for Close
	sweepAt int                 // len(held) at which expired entries are swept out
}

// heldInfo is what Close needs of a lease: its Redis key, and start+ttl on the local clock (entries
// surely expired are dropped, so that leases never released do not pile up).
type heldInfo struct {
	rkey    string
	expires time.Time
}

// minSweep is the smallest number of held leases at which expired ones are swept out.
const minSweep = 1024

// New returns a Limiter that keeps its leases in rdb. It starts no goroutine. Options are applied in
// order; New returns the first option error.
func New(rdb redis.UniversalClient, opts ...Option) (*Limiter, error) {
	if rdb == nil {
		return nil, errors.New("concurrency: nil Redis client")
	}
	o := defaultOptions()
	if err := option.Apply(&o, ErrBadOption, opts); err != nil {
		return nil, err
	}
	var b [8]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	brdb, owned := bounded(rdb, o.timeout, o.logger)
	l := &Limiter{
		rdb:     brdb,
		owned:   owned,
		o:       o,
		guard:   newGuard(brdb, o.logger),
		tag:     hex.EncodeToString(b[:]),
		held:    make(map[*Lease]heldInfo),
		sweepAt: minSweep,
	}
	if owned {
		// Close releases the client of our own; for a caller that never calls Close, it is closed
		// once the Limiter is unreachable.
		l.cleanup = runtime.AddCleanup(l, func(c redis.UniversalClient) { _ = c.Close() }, brdb)
	}
	return l, nil
}

// Stats returns a snapshot of the Limiter's counters (each read atomically, not all at one instant).
// It does no I/O.
func (l *Limiter) Stats() Stats {
	c := &l.stats
	return Stats{Acquired: c.Acquired.Load(), Denied: c.Denied.Load(), Fallbacks: c.Fallbacks.Load(),
		RedisErrors: c.RedisErrors.Load(), ReleaseErrors: c.ReleaseErrors.Load()}
}

// validate checks the arguments of TryAcquire and Acquire.
func validate(key string, limit int, ttl time.Duration) error {
	switch {
	case len(key) == 0 || len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidKey, len(key), MaxKeyLen)
	case limit < 1 || limit > MaxLimit:
		return fmt.Errorf("%w: %d, want 1 to %d", ErrInvalidLimit, limit, MaxLimit)
	}
	return validTTL(ttl)
}

func validTTL(ttl time.Duration) error {
	if ttl <= 0 || ttl > MaxTTL {
		return fmt.Errorf("%w: %v, want more than 0 and at most %v", ErrInvalidTTL, ttl, MaxTTL)
	}
	return nil
}

// ttlMS returns ttl in whole milliseconds, rounded up.
func ttlMS(ttl time.Duration) int64 { return int64((ttl + time.Millisecond - 1) / time.Millisecond) }

// TryAcquire takes a lease on one of key's limit slots, for ttl, if one is free now; it never waits.
// Check [Lease.Acquired]: a full key is not an error. A granted lease holds its slot until
// [Lease.Release], or until ttl has passed on Redis's clock without a [Lease.Extend]. Pick ttl
// longer than the work the lease guards: a lease that expires while its holder still works gives
// its slot to another caller, and the key is then over its limit by one until the holder ends.
//
// If Redis cannot decide (unreachable, too slow, refusing the call, or the key is unusable, such as
// WRONGTYPE), the failure policy does, and [Lease.Source] says so; Redis errors are never returned.
// The error is non-nil only when no decision could be made: invalid arguments (ErrInvalidKey,
// ErrInvalidLimit, ErrInvalidTTL), ErrClosed, or ctx's error if it ended first.
//
// Keys are 1 to MaxKeyLen bytes of anything; the same key must be used with the same limit
// everywhere (a call checks the count against its own limit). limit is 1 to MaxLimit, ttl is
// positive, at most MaxTTL, and used in whole milliseconds (rounded up).
func (l *Limiter) TryAcquire(ctx context.Context, key string, limit int, ttl time.Duration) (*Lease, error) {
	if err := validate(key, limit, ttl); err != nil {
		return nil, err
	}
	if l.closed.Load() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ls := &Lease{l: l, key: key, num: l.seq.Add(1)}
	ls.id = l.tag + "-" + strconv.FormatUint(ls.num, 36)
	rkey := redisKey(l.o.prefix, key)
	start := l.o.now() // the lease expires no earlier than start+ttl on Redis's clock
	rep, f, err := l.call(ctx, rkey, opAcquire, ls.id, limit, ttlMS(ttl))
	if errors.Is(err, redisx.ErrBreakerOpen) {
		return l.decideLocally(ls, limit, ttl), nil // nothing was sent: nothing to count as an error
	}
	switch f {
	case faultNone:
	case faultCanceled:
		// The script may have run: give back what it may have granted, rather than wait for the TTL.
		_ = l.releaseRedis(context.WithoutCancel(ctx), rkey, ls.id)
		return nil, ctx.Err()
	default:
		l.stats.RedisErrors.Add(1)
		return l.decideLocally(ls, limit, ttl), nil
	}
	ls.source = outcome.SourceCentral
	ls.inFlight = rep.inFlight
	if !rep.ok {
		l.stats.Denied.Add(1)
		ls.retryAfter = time.Duration(rep.waitMS) * time.Millisecond
		return ls, nil
	}
	l.stats.Acquired.Add(1)
	ls.acquired = true
	if !l.track(ls, rkey, start.Add(ttl)) { // Close ran meanwhile
		_ = l.releaseRedis(context.WithoutCancel(ctx), rkey, ls.id)
		return nil, ErrClosed
	}
	return ls, nil
}

// track records a Redis lease for Close, sweeping out expired entries once the map has doubled. It
// returns false, and records nothing, once Close has begun (Close sets closed before it takes mu).
func (l *Limiter) track(ls *Lease, rkey string, expires time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed.Load() {
		return false
	}
	l.held[ls] = heldInfo{rkey: rkey, expires: expires}
	if len(l.held) < l.sweepAt {
		return true
	}
	// A lease expires in Redis between its start+ttl and start+timeout+ttl (the script ran before the
	// reply, which came within the timeout): past the latter, it is surely gone.
	cutoff := l.o.now().Add(-l.o.timeout)
	for h, info := range l.held {
		if cutoff.After(info.expires) {
			delete(l.held, h)
		}
	}
	l.sweepAt = max(minSweep, 2*len(l.held))
	return true
}

// untrack removes ls from the held leases; it returns its Redis key, or false if Close took it.
func (l *Limiter) untrack(ls *Lease) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	info, ok := l.held[ls]
	delete(l.held, ls)
	return info.rkey, ok
}

// extended moves ls's expiry in the held leases.
func (l *Limiter) extended(ls *Lease, expires time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if info, ok := l.held[ls]; ok {
		info.expires = expires
		l.held[ls] = info
	}
}

// decideLocally applies the failure policy to ls.
func (l *Limiter) decideLocally(ls *Lease, limit int, ttl time.Duration) *Lease {
	l.stats.Fallbacks.Add(1)
	ls.source, ls.fallback = outcome.SourceFallback, l.o.policy
	switch l.o.policy {
	case outcome.FailOpen:
		ls.acquired = true
	case outcome.FailClosed:
		ls.retryAfter = redisx.DefaultBreakerCooldown
	default:
		ls.acquired, ls.inFlight, ls.retryAfter = l.fb.acquire(ls.key, ls.num, share(limit, l.o.nodes), ttl, l.o.now())
	}
	if ls.acquired {
		l.stats.Acquired.Add(1)
	} else {
		l.stats.Denied.Add(1)
	}
	return ls
}

// Acquire is TryAcquire that waits for a free slot: it tries again, with growing pauses (2ms to
// 50ms, with jitter), until it holds a lease or ctx ends, in which case it returns ctx's error. It
// returns a lease that is not acquired only when the failure policy denied it ([Lease.Unavailable]),
// so that the caller can tell "limiter unavailable" from "busy". Waiters are not queued: a waiter
// may be overtaken by later callers.
func (l *Limiter) Acquire(ctx context.Context, key string, limit int, ttl time.Duration) (*Lease, error) {
	pause := pollMin
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		ls, err := l.TryAcquire(ctx, key, limit, ttl)
		if err != nil || ls.acquired || ls.Unavailable() {
			return ls, err
		}
		d := pause/2 + rand.N(pause/2+1)
		if ls.retryAfter > 0 && ls.retryAfter < d {
			d = ls.retryAfter
		}
		if t == nil {
			t = time.NewTimer(d)
		} else {
			t.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, pollMax)
	}
}

// InFlight returns the number of unexpired leases key holds in Redis (leases granted by a failure
// policy are not in Redis). It is for monitoring and tests; it goes through the circuit breaker as
// every call does. Its error is ctx's if it ended first, or wraps ErrUnavailable when Redis could
// not answer (the breaker is open, or the call failed).
func (l *Limiter) InFlight(ctx context.Context, key string) (int, error) {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return 0, fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	rep, f, err := l.call(ctx, redisKey(l.o.prefix, key), opCount, "", 0, 0)
	switch f {
	case faultNone:
		return rep.inFlight, nil
	case faultCanceled:
		return 0, ctx.Err()
	}
	if errors.Is(err, ErrUnavailable) {
		return 0, fmt.Errorf("concurrency: in flight: %w", err)
	}
	return 0, fmt.Errorf("%w: in flight: %w", ErrUnavailable, err)
}

// releaseRedis removes a lease from Redis; its error wraps ErrUnavailable when Redis did not answer.
func (l *Limiter) releaseRedis(ctx context.Context, rkey, id string) error {
	_, f, err := l.call(ctx, rkey, opRelease, id, 0, 0)
	if f == faultNone {
		return nil
	}
	if errors.Is(err, redisx.ErrBreakerOpen) {
		l.stats.ReleaseErrors.Add(1)
		return fmt.Errorf("concurrency: release: %w", err)
	}
	l.stats.ReleaseErrors.Add(1)
	if n, ok := l.releaseLog.due(l.o.now()); ok {
		l.o.logger.Warn("concurrency: release failed; the slot returns when the lease expires",
			"failures", n, "last_error", err)
	}
	return fmt.Errorf("%w: release: %w", ErrUnavailable, err)
}

// Close makes TryAcquire and Acquire return ErrClosed, then releases every Redis lease of this
// Limiter not released yet, so that a clean shutdown gives its slots back at once instead of after
// their TTL: call it once the work those leases guard has stopped. It returns the first release
// error (the other slots come back at their TTL). Last, it closes the cluster client New built for
// itself from a cluster client created without ContextTimeoutEnabled (see [WithTimeout]; never the
// caller's client): an Extend after Close then fails with ErrUnavailable. Close starts and leaves no
// goroutine; calling it again does nothing.
func (l *Limiter) Close(ctx context.Context) error {
	if !l.closed.CompareAndSwap(false, true) {
		return nil
	}
	defer func() {
		if l.owned {
			l.cleanup.Stop()
			_ = l.rdb.Close()
		}
	}()
	l.mu.Lock()
	held := l.held
	l.held = make(map[*Lease]heldInfo)
	l.mu.Unlock()
	var first error
	for ls, info := range held {
		if !ls.released.CompareAndSwap(false, true) {
			continue
		}
		if err := l.releaseRedis(ctx, info.rkey, ls.id); err != nil && first == nil {
			first = err
		}
	}
	return first
}
