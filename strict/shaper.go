package strict

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ErrWaitTooLong is returned by [Shaper.WaitN] when the work would have to wait longer than the
// shaper's MaxWait or than the context's deadline allows. Nothing was booked.
var ErrWaitTooLong = errors.New("strict: shaper: wait would exceed MaxWait or the context deadline")

// ShaperRule configures a [Shaper]: Limit units may run at once, then Limit per Period, evenly
// spaced. The zero ShaperRule is invalid (NewShaper says why); it is a plain value, safe to copy
// and share.
type ShaperRule struct {
	// Name identifies the shaper in Redis keys; 1 to 64 bytes of [A-Za-z0-9_.-].
	Name string
	// Limit is the burst, and the units per Period; 1 to MaxLimit.
	Limit int64
	// Period is the time in which Limit units may run; MinPeriod to MaxPeriod.
	Period time.Duration
	// MaxWait is the longest delay a reservation may be given (the length of the global queue); a
	// request that would wait longer is refused and books nothing. 0 to MaxPeriod; 0 makes the
	// shaper a plain limiter.
	MaxWait time.Duration
}

// Shaper is a global leaky-bucket shaper: instead of denying, it books each request into a schedule
// shared through Redis and says how long the caller must wait before the work may run, like
// x/time/rate's Reserve and Wait but across every process. Create it with [Limiter.NewShaper]; it is
// safe for concurrent use. Most callers want [Shaper.WaitN].
//
// A booking cannot be cancelled (see [Reservation]): work that is abandoned after its reservation
// (say, its context ended while it waited) still used its slot.
type Shaper struct {
	l    *Limiter
	rule ShaperRule
}

// Reservation is a [Shaper]'s answer, read through its methods as hybrid.Reservation is. A nil or
// zero Reservation is refused. It is immutable, so safe for concurrent use.
//
// It has no Cancel, unlike hybrid.Reservation: a booking is a place in a schedule shared through
// Redis, behind which later bookings have already been placed and told their delays, and giving it
// back would need a Redis call of its own that moves the schedule's end (as x/time/rate's Cancel
// restores only what was not reserved since), which this package does not make. Work that is
// abandoned after its reservation still used its slot.
type Reservation struct {
	ok    bool
	delay time.Duration
}

// OK reports whether the units were booked. It does no I/O.
func (r *Reservation) OK() bool { return r != nil && r.ok }

// Delay returns how long to wait before the work may run (zero within the burst). When OK is false it
// is the delay the request would have needed, more than the maximum wait. It does no I/O.
func (r *Reservation) Delay() time.Duration {
	if r == nil {
		return 0
	}
	return r.delay
}

// NewShaper validates r and returns a shaper that keeps its schedule through l. It does no I/O.
// Errors wrap [ErrInvalid] (a bad name, limit, period or max wait).
func (l *Limiter) NewShaper(r ShaperRule) (*Shaper, error) {
	rule := Rule{Name: r.Name, Algorithm: GCRA, Limit: r.Limit, Period: r.Period}
	if err := rule.Validate(); err != nil {
		return nil, err
	}
	if r.MaxWait < 0 || r.MaxWait > MaxPeriod {
		return nil, fmt.Errorf("%w: shaper %q: max wait %v out of range [0, %v]", ErrInvalid, r.Name, r.MaxWait, MaxPeriod)
	}
	return &Shaper{l: l, rule: r}, nil
}

// Reserve is shorthand for ReserveN(ctx, subject, 1).
func (sh *Shaper) Reserve(ctx context.Context, subject string) (*Reservation, error) {
	return sh.ReserveN(ctx, subject, 1)
}

// ReserveN books n units for subject in one Redis call and returns how long the caller must wait
// before using them. A refused reservation (it would wait longer than MaxWait) is not an error and
// books nothing. The subject is also the key's hash tag: it must not contain '}' unless subjects are
// hashed. Errors: [ErrInvalid] for a bad subject or n (nothing sent); a Redis failure wraps
// [ErrUnavailable]; the context's error. The Reservation is nil exactly when the error is not.
func (sh *Shaper) ReserveN(ctx context.Context, subject string, n int64) (*Reservation, error) {
	return sh.reserve(ctx, subject, n, sh.rule.MaxWait)
}

// Wait is shorthand for WaitN(ctx, subject, 1).
func (sh *Shaper) Wait(ctx context.Context, subject string) error {
	return sh.WaitN(ctx, subject, 1)
}

// WaitN books n units for subject and sleeps until they may be used. It books nothing and returns
// [ErrWaitTooLong] when the wait would exceed MaxWait or the context's deadline. If ctx ends while it
// sleeps it returns ctx.Err(), and the booked slot is lost.
func (sh *Shaper) WaitN(ctx context.Context, subject string, n int64) error {
	limit := sh.rule.MaxWait
	if dl, ok := ctx.Deadline(); ok {
		left := dl.Sub(sh.l.opts.now())
		if left <= 0 {
			return ctx.Err()
		}
		limit = min(limit, left)
	}
	r, err := sh.reserve(ctx, subject, n, limit)
	if err != nil {
		return err
	}
	if !r.ok {
		return fmt.Errorf("%w: %q needs %v, may wait %v", ErrWaitTooLong, subject, r.delay, limit)
	}
	return sh.l.sleep(ctx, r.delay)
}

// reserve books n units, refusing a delay above maxWait.
func (sh *Shaper) reserve(ctx context.Context, subject string, n int64, maxWait time.Duration) (*Reservation, error) {
	l := sh.l
	if err := l.validTag(subject); err != nil {
		return nil, err
	}
	if n < 1 || n > sh.rule.Limit {
		return nil, fmt.Errorf("%w: shaper %q: n=%d out of range [1, limit=%d]", ErrInvalid, sh.rule.Name, n, sh.rule.Limit)
	}
	tag := l.hashed(subject)
	keys := []string{key(l.opts.prefix, tag, sh.rule.Name, "lb", tag)}
	args := []any{
		strconv.FormatInt(l.clock.Load(), 10), strconv.FormatInt(maxWait.Microseconds(), 10),
		"lb", strconv.FormatInt(sh.rule.Limit, 10), strconv.FormatInt(sh.rule.Period.Microseconds(), 10),
		strconv.FormatInt(n, 10),
	}
	res, err := l.call(ctx, shaperScript, keys, args)
	if err != nil {
		return nil, fmt.Errorf("strict: shaper %s on %q: %w", sh.rule.Name, subject, err)
	}
	var out [1]Decision
	ok, err := decode(res, out[:], func(int) int64 { return sh.rule.Limit }, nil)
	if err != nil {
		l.stats.Errors.Add(1)
		return nil, err
	}
	if !ok {
		l.stats.Denied.Add(1)
	}
	return &Reservation{ok: ok, delay: out[0].RetryAfter}, nil
}
