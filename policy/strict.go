package policy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"

	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/strict"
)

// maxFallback bounds the local limiters of strict rules under outcome.LocalFallback.
const maxFallback = 1 << 16

// checkStrict runs the strict ones of the enforced counters in one atomic script call under hash tag
// tag (all count or none does) and records the outcome in res; when Redis cannot answer, their
// failure policies do.
func (e *Enforcer) checkStrict(ctx context.Context, c *compiled, tag string, enforced []planned, res *Result) error {
	var ps [strict.MaxChecks]*planned
	var checks [strict.MaxChecks]strict.Check
	k := 0
	for i := range enforced {
		if p := &enforced[i]; p.r.strict {
			ps[k] = p
			checks[k] = strict.Check{Rule: p.u.strict, Subject: p.sub(), N: p.n}
			k++
		}
	}
	m, err := e.allowStrict(ctx, tag, checks[:k])
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return ctx.Err()
		}
		if !strictUnavailable(err) {
			return fmt.Errorf("policy: strict rules: %w", err)
		}
		e.stats.Fallback.Add(1)
		e.strictFallback(ps[:k], res)
		return nil
	}
	start := len(res.Decisions)
	for i := 0; i < k; i++ {
		d := strictDecision(ps[i], m, i)
		res.Decisions = append(res.Decisions, d)
		if !d.Allowed {
			e.remember(ps[i], c.gen, d.RetryAfter)
		}
	}
	if !m.Allowed {
		res.denyWorst(start)
	}
	return nil
}

// strictFallback answers the strict counters by their failure policies, all or nothing: local
// reservations are cancelled unless every counter admits.
func (e *Enforcer) strictFallback(ps []*planned, res *Result) {
	now := e.now()
	var cancels [strict.MaxChecks]func()
	allowed := true
	start := len(res.Decisions)
	for i, p := range ps {
		d := p.decision(false, outcome.SourceFallback)
		switch p.r.failure {
		case outcome.FailOpen:
			d.Allowed = true
		case outcome.FailClosed:
			d.RetryAfter = strict.DefaultBreakerCooldown
			d.Unavailable = true
		default:
			ok, wait, cancel := e.fb.reserve(p.key, p.u, p.n, e.cfg.FallbackNodes, now)
			d.Allowed, d.RetryAfter, cancels[i] = ok, wait, cancel
		}
		d.ResetAfter = d.RetryAfter
		allowed = allowed && d.Allowed
		res.Decisions = append(res.Decisions, d)
	}
	if allowed {
		return
	}
	for _, cancel := range cancels[:len(ps)] {
		if cancel != nil {
			cancel()
		}
	}
	res.denyWorst(start)
}

// strictDecision converts the result of the i-th strict counter of m, one request's atomic call.
func strictDecision(p *planned, m strict.MultiResult, i int) Decision {
	r, all := m.Decisions[i], m.Allowed
	d := p.decision(r.Allowed, outcome.SourceStrict)
	d.Remaining, d.RetryAfter, d.ResetAfter = r.Remaining, r.RetryAfter, max(r.ResetAfter, r.RetryAfter)
	d.Excess = r.Excess
	if !all && r.Allowed {
		// This counter had room, but another denied: nothing was counted.
		d.RetryAfter = 0
	}
	return d
}

// fallbacks holds the local limiters of strict rules under outcome.LocalFallback while Redis is away. Hybrid
// rules use the hybrid limiter's own fallback; this is the only other copy, because hybrid's cannot
// serve strict rules: a request's strict counters are reserved all or nothing (a reservation is
// cancelled when another counter denies, which hybrid.Limiter.AllowN cannot undo), and a strict
// rule's share is its limit over Config.FallbackNodes, not over the node count Redis last reported.
type fallbacks struct {
	c *lru.Cache[string, *rate.Limiter]
}

func newFallbacks(size int) *fallbacks {
	c, _ := lru.New[string, *rate.Limiter](size)
	return &fallbacks{c: c}
}

// reserve takes n tokens for key from a local limiter enforcing the unit's limit divided by nodes. It
// returns whether they were available, how long until they would be, and a function that puts them
// back (nil when nothing was taken).
func (f *fallbacks) reserve(key string, u *unit, n int64, nodes int, now time.Time) (bool, time.Duration, func()) {
	if n > u.limit {
		return false, u.window, nil // only UpstreamWindow takes such a cost, which it always refuses
	}
	r := rate.Limit(float64(u.limit) / u.window.Seconds() / float64(nodes))
	b := int(max(u.limit/int64(nodes), n, 1))
	l, ok := f.c.Get(key)
	if !ok {
		l = rate.NewLimiter(r, b)
		if prev, found, _ := f.c.PeekOrAdd(key, l); found {
			l = prev
		}
	}
	if l.Limit() != r || l.Burst() != b {
		l.SetLimitAt(now, r)
		l.SetBurstAt(now, b)
	}
	res := l.ReserveN(now, int(min(n, math.MaxInt32)))
	if !res.OK() {
		return false, time.Duration(math.MaxInt64), nil
	}
	if wait := res.DelayFrom(now); wait > 0 {
		res.CancelAt(now)
		return false, wait, nil
	}
	return true, 0, func() { res.CancelAt(now) }
}
