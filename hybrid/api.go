package hybrid

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/outcome"
)

// ErrUnavailable is wrapped by every error that means Redis could not serve a call and no failure
// policy decided in its place: [Limiter.WaitN] when a decision needed Redis and the failure policy
// is outcome.FailClosed (waiting would not help). It is the same value as concurrency.ErrUnavailable and
// strict.ErrUnavailable, so one errors.Is test serves every package.
var ErrUnavailable = redisx.ErrUnavailable

// check validates the arguments of the methods other than AllowN and DecideN (which check them inline).
func (l *Limiter) check(ctx context.Context, key string, limit Limit, n int64) error {
	if l.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(key) == 0 || len(key) > MaxKeyLen {
		return invalidKey(key)
	}
	if err := limit.Validate(); err != nil {
		return err
	}
	if n < 1 || n > limit.Burst {
		return fmt.Errorf("%w: n=%d: want 1 to burst (%d)", ErrInvalidCost, n, limit.Burst)
	}
	return nil
}

// Wait is shorthand for WaitN(ctx, key, limit, 1).
func (l *Limiter) Wait(ctx context.Context, key string, limit Limit) error {
	return l.WaitN(ctx, key, limit, 1)
}

// WaitN blocks until n tokens for key under limit are admitted (and takes them), or ctx ends. Each
// attempt is a [Limiter.DecideN]; after a denial WaitN sleeps the decision's RetryAfter on a timer
// and tries again, so a waiting caller costs what a caller honouring RetryAfter costs, and waiters
// are admitted in no particular order (there is no queue: unlike x/time/rate, a distributed
// limiter cannot reserve future tokens without charging other nodes for them).
//
// WaitN returns an error at once, without waiting, when
//   - n can never be admitted (n > limit.Burst: ErrInvalidCost) or the input is invalid;
//   - ctx has a deadline sooner than the next attempt: the error wraps context.DeadlineExceeded,
//     like x/time/rate's WaitN;
//   - Redis cannot answer and the failure policy is outcome.FailClosed: the error wraps [ErrUnavailable]
//     (sleeping through an outage of unknown length would pile up blocked callers; retry later or
//     choose another policy). With outcome.LocalFallback, WaitN waits for the fallback limiter's tokens
//     (its denials carry the time until it holds n tokens), and fails at once only past the deadline.
//
// When ctx ends while WaitN sleeps, it returns ctx.Err() wrapped. A banned key is a denial like any
// other: WaitN sleeps until the ban ends, within ctx. Accuracy is AllowN's (docs/api.md).
func (l *Limiter) WaitN(ctx context.Context, key string, limit Limit, n int64) error {
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		d, err := l.DecideN(ctx, key, limit, n)
		if err != nil {
			if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
				return fmt.Errorf("hybrid: wait(n=%d): %w", n, cerr)
			}
			return err
		}
		if d.Allowed {
			return nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("hybrid: wait(n=%d): %w", n, cerr) // the check timed out with ctx
		}
		if d.Unavailable {
			return fmt.Errorf("hybrid: wait(n=%d) for %q: the failure policy is outcome.FailClosed: %w", n, key, ErrUnavailable)
		}
		wait := max(d.RetryAfter, time.Microsecond)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return fmt.Errorf("hybrid: wait(n=%d) would exceed the context deadline (retry after %v): %w", n, wait,
				context.DeadlineExceeded)
		}
		if t == nil {
			t = time.NewTimer(wait)
		} else {
			t.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("hybrid: wait(n=%d): %w", n, ctx.Err())
		case <-t.C:
		}
	}
}

// Reservation is an admission made by [Limiter.ReserveN] that can be undone with
// [Reservation.Cancel]. It is safe for concurrent use. The zero Reservation is a refused one (OK
// is false, Cancel gives nothing back), as strict.Reservation's is.
type Reservation struct {
	d         Decision
	l         *Limiter
	key       string
	n         int64
	cancelled atomic.Bool
}

// OK reports whether the tokens were admitted. It does no I/O.
func (r *Reservation) OK() bool { return r.d.Allowed }

// Decision returns the decision that made the reservation. It does no I/O.
func (r *Reservation) Decision() Decision { return r.d }

// Cancel gives the reservation's tokens back, as [Limiter.Refund] does, and returns how many it gave
// back: 0 when the reservation was not OK or was already cancelled, or when the tokens can no longer
// be given back (see Refund). Later calls do nothing.
func (r *Reservation) Cancel() int64 {
	if !r.d.Allowed || !r.cancelled.CompareAndSwap(false, true) {
		return 0
	}
	got, err := r.l.Refund(context.Background(), r.key, r.d.Limit, r.n)
	if err != nil {
		return 0
	}
	return got
}

// Reserve is shorthand for ReserveN(ctx, key, limit, 1).
func (l *Limiter) Reserve(ctx context.Context, key string, limit Limit) (*Reservation, error) {
	return l.ReserveN(ctx, key, limit, 1)
}

// ReserveN decides like [Limiter.DecideN] — the tokens are admitted now or not at all — and returns
// the decision as a [Reservation] whose Cancel gives the tokens back, for a caller that may find
// later that it will not use them (a request admitted by one rule and denied by the next). Unlike
// x/time/rate's ReserveN, it never reserves tokens in the future: in a distributed limiter that
// would charge tokens that other nodes may need now. Errors are AllowN's.
func (l *Limiter) ReserveN(ctx context.Context, key string, limit Limit, n int64) (*Reservation, error) {
	d, err := l.DecideN(ctx, key, limit, n)
	if err != nil {
		return nil, err
	}
	return &Reservation{d: d, l: l, key: key, n: n}, nil
}

// Refund gives back n tokens for key under limit that an earlier admission on this limiter took and
// did not use, and returns how many it gave back. The tokens return to this node's allowance for the
// key (its lease, or the debt it would otherwise report), where its next decisions can use them at
// once with no I/O; they are not returned to the global bucket for other nodes. This is exact under
// the cumulative protocol (docs/api.md): Redis is never charged for a token twice, and its count of
// admitted tokens never exceeds what this node admitted less what it refunded before reporting.
//
// Refund gives back at most what this node's entry for the key admitted and still counts as used;
// it gives back less than n (possibly 0) when
//   - the tokens were admitted by another node, or by a one-off take (the key cap was full);
//   - the entry was evicted or Reset since (everything it admitted was then counted by Redis);
//   - the lease they came from has reached LeaseLife: they are written off, as its unused part is.
//
// Tokens the failure policy admitted while Redis was away are refunded from what will be reported
// to Redis, but the outcome.LocalFallback limiter's own local bucket is not refilled.
//
// Tokens refunded into an unexpired lease may be used until that lease's life ends. Refund does no
// I/O; ctx is checked but otherwise unused. Errors: invalid input, ErrClosed, a cancelled ctx.
func (l *Limiter) Refund(ctx context.Context, key string, limit Limit, n int64) (int64, error) {
	if err := l.check(ctx, key, limit, n); err != nil {
		return 0, err
	}
	e := l.store.Lookup(key, l.store.Hash(key))
	if e == nil {
		return 0, nil
	}
	return e.Refund(n, l.mono()), nil
}

// Peek estimates the tokens left for key under limit without taking any, and returns the estimate
// as a Decision: Remaining is the estimate, Allowed reports Remaining ≥ 1, RetryAfter (when not
// Allowed) is the time the refill takes to bring it to one token, and Source says where the
// estimate comes from:
//   - outcome.SourceLocal: this node has Redis's answer for the key. The estimate is the global bucket at
//     that answer, refilled at limit.Rate since (capped at Burst), plus this node's unused lease. It
//     does not see what other nodes consumed since that answer (at most one sync interval old while
//     the key is busy, up to LeaseLife for a quiet key): it can overestimate by their consumption.
//   - outcome.SourceCentral: the key is unknown here, so Peek reads the bucket from Redis (one read-only
//     script call, bounded by ctx and WithFlushTimeout): exact at that instant, except that tokens
//     other nodes hold as leases are not in it (they may still be used). A bucket Redis does not
//     hold is full.
//   - outcome.SourceDenyCache: the key is banned (Remaining 0, RetryAfter until the ban ends).
//
// Peek is not a promise: AllowN may decide otherwise (cold-start and overdraft credit can admit a
// request the estimate says has no token; other nodes can spend the tokens). A Redis error is
// returned wrapped (Peek is no decision, so no failure policy applies).
func (l *Limiter) Peek(ctx context.Context, key string, limit Limit) (Decision, error) {
	if err := l.check(ctx, key, limit, 1); err != nil {
		return Decision{}, err
	}
	if !l.deny.Empty() {
		if d, ok := l.denied(key, limit); ok {
			return d, nil
		}
	}
	burstMicro := limit.Burst * 1_000_000
	var micro int64 // the estimate, micro-tokens
	src := outcome.SourceLocal
	e := l.store.Lookup(key, l.store.Hash(key))
	if e != nil && e.GrantedAt() != 0 {
		g, _ := e.Global()
		if elapsed := l.mono() - e.GrantedAt(); elapsed > 0 && g < burstMicro {
			g = int64(min(float64(g)+float64(elapsed)/1e3*limit.Rate, float64(burstMicro)))
		}
		micro = min(g+e.Unused()*1_000_000, burstMicro)
	} else {
		p, err := l.central.PeekBucket(ctx, key, central.Limit{Rate: limit.Rate, Burst: limit.Burst})
		if err != nil {
			return Decision{}, fmt.Errorf("hybrid: peek: %w", err)
		}
		micro, src = p.Tokens, outcome.SourceCentral
	}
	rem := max(micro/1_000_000, 0)
	d := Decision{Allowed: rem >= 1, Limit: limit, Remaining: rem, ResetAfter: resetAfter(limit, rem), Source: src}
	if !d.Allowed {
		d.RetryAfter = time.Duration(min(float64(1_000_000-micro)/limit.Rate*1e3, 1<<62))
	}
	return d, nil
}

// Reset is an administrative operation: it deletes the global bucket of key in Redis (whatever its limit),
// with every node's record on it, so that the next decision anywhere finds a full bucket, and drops
// this node's entry for the key (its unused lease and any consumption not yet reported are
// forgotten, as the bucket they belong to is). A ban is not lifted (see Unban).
//
// Other nodes keep their entries: each may go on using the unused lease it holds, until that
// lease's LeaseLife (8 s) at most, and its next call for the key starts a record in the new bucket
// (charging there only its consumption beyond what the deleted bucket had charged it). A reconcile
// of this node in flight while Reset runs may recreate the bucket with that call's charge. Reset
// goes to Redis directly, not through the circuit breaker; a Redis error is returned wrapped, and
// the local entry is dropped either way.
func (l *Limiter) Reset(ctx context.Context, key string, limit Limit) error {
	if err := l.check(ctx, key, limit, 1); err != nil {
		return err
	}
	l.store.Remove(key, l.store.Hash(key))
	l.deny.Forget(key)
	l.fallback.Remove(key)
	if _, err := l.central.DeleteBucket(ctx, key, central.Limit{Rate: limit.Rate, Burst: limit.Burst}); err != nil {
		return fmt.Errorf("hybrid: reset: %w", err)
	}
	return nil
}
