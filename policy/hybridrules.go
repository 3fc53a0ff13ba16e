package policy

import (
	"context"
	"fmt"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
)

// newHybrid creates the Enforcer's hybrid limiter; tests count its calls.
var newHybrid = hybrid.New

// limiterLocked returns the Enforcer's hybrid limiter, creating it on first use. There is one per
// Enforcer: rules differ in their limits, failure policy included (hybrid.Limit.OnFailure).
func (e *Enforcer) limiterLocked() (*hybrid.Limiter, error) {
	if e.lim != nil {
		return e.lim, nil
	}
	opts := append(append([]hybrid.Option(nil), e.cfg.HybridOptions...),
		hybrid.WithLogger(e.cfg.Logger), hybrid.WithKeyPrefix(e.cfg.KeyPrefix))
	l, err := newHybrid(e.cfg.Redis, opts...)
	if err != nil {
		return nil, fmt.Errorf("policy: hybrid limiter: %w", err)
	}
	e.lim = l
	return l, nil
}

// Limiter returns the hybrid limiter that serves every hybrid rule whatever its failure policy, for
// its Stats; nil until a policy with hybrid rules has been set. It belongs to the Enforcer: do not
// close it. Safe for concurrent use; no I/O.
func (e *Enforcer) Limiter() *hybrid.Limiter {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lim
}

// withFailure sets the failure policy of hybrid units.
func withFailure(units []unit, fp outcome.FailurePolicy) {
	for i := range units {
		units[i].hybrid.OnFailure = fp
	}
}

// hybridDecision converts a hybrid rule's hybrid.Decision.
func hybridDecision(p *planned, hd hybrid.Decision) Decision {
	d := p.decision(hd.Allowed, hd.Source)
	d.Remaining, d.RetryAfter, d.ResetAfter = max(hd.Remaining, 0), max(hd.RetryAfter, 0), max(hd.ResetAfter, hd.RetryAfter, 0)
	d.Unavailable = hd.Unavailable
	return d
}

// appendHybrid appends hybridDecision(p, *hd) to ds, writing its fields into ds's next slot (every
// field: the slot may hold an older Decision) rather than copying a Decision built apart, which
// costs a 112-byte copy with the collector's write barriers and, as the copy reads with wide loads
// what was written with narrow stores, a store-forwarding stall (TestAppendHybridWritesEveryField).
func appendHybrid(ds []Decision, p *planned, hd *hybrid.Decision) []Decision {
	n := len(ds)
	if n == cap(ds) {
		return append(ds, hybridDecision(p, *hd))
	}
	ds = ds[:n+1]
	d := &ds[n]
	d.Rule, d.Unit, d.Algorithm, d.Shadow, d.Allowed = p.r.id, p.u.name, p.r.algo, false, hd.Allowed
	d.Limit, d.Window, d.Remaining, d.Excess = p.u.limit, p.u.window, max(hd.Remaining, 0), 0
	d.RetryAfter, d.ResetAfter = max(hd.RetryAfter, 0), max(hd.ResetAfter, hd.RetryAfter, 0)
	d.Source, d.Unavailable = hd.Source, hd.Unavailable
	return ds
}

// peekHybrid answers a check-only request's enforced hybrid counters with the limiter's estimate for
// one unit, consuming and remembering nothing; the first that has no unit left denies.
func (e *Enforcer) peekHybrid(ctx context.Context, enforced []planned, res *Result) error {
	for i := range enforced {
		p := &enforced[i]
		if p.r.strict {
			continue
		}
		hd, err := p.r.lim.Peek(ctx, p.key, p.u.hybrid)
		if err != nil {
			return fmt.Errorf("policy: rule %q: %w", p.r.id, err)
		}
		d := hybridDecision(p, hd)
		res.Decisions = append(res.Decisions, d)
		if !hd.Allowed {
			res.Allowed, res.Rule, res.RetryAfter = false, p.r.id, d.RetryAfter
			return nil
		}
	}
	return nil
}

// checkHybrid consults the request's enforced hybrid counters, narrowest first, each taking the
// request's cost when it admits; the first denial stops it and is remembered in the memo. A counter
// with a borrowed key (keyBuf) is tried on hybrid's fast path, which keeps no key; when that does
// not admit, every key of enforced (all of the request's counters: see check) is owned before
// DecideN, which may keep it.
func (e *Enforcer) checkHybrid(ctx context.Context, c *compiled, enforced []planned, res *Result) error {
	for i := range enforced {
		p := &enforced[i]
		if p.r.strict {
			continue
		}
		if p.borrowed {
			if hd, ok := p.r.lim.DecideLocalN(ctx, p.key, p.u.hybrid, p.n); ok {
				res.Decisions = appendHybrid(res.Decisions, p, &hd)
				continue
			}
			ownKeys(enforced)
		}
		hd, err := p.r.lim.DecideN(ctx, p.key, p.u.hybrid, p.n)
		if err != nil {
			e.refundHybrid(ctx, enforced[:i]) // no decision: the request is not admitted either
			return fmt.Errorf("policy: rule %q: %w", p.r.id, err)
		}
		d := hybridDecision(p, hd)
		res.Decisions = append(res.Decisions, d)
		if !hd.Allowed {
			if !d.Unavailable { // a fail-closed denial says nothing about the subject: not remembered
				e.remember(p, c.gen, d.RetryAfter)
			}
			res.Allowed, res.Rule, res.RetryAfter, res.Unavailable = false, p.r.id, d.RetryAfter, d.Unavailable
			if !c.shadowAll {
				e.refundHybrid(ctx, enforced[:i])
			}
			return nil
		}
	}
	return nil
}

// refundHybrid gives back the cost each hybrid counter of admitted took, when a later counter denied
// the request (hybrid.Limiter.Refund, what Reservation.Cancel does, without its allocation): no rule
// keeps a charge for a request that was not admitted. Refund does no I/O; the tokens return to this
// process's allowance for the key. What could not be given back (tokens taken by a one-off take when
// the key cap was full, say) is counted in Stats.Unrefunded.
func (e *Enforcer) refundHybrid(ctx context.Context, admitted []planned) {
	ctx = context.WithoutCancel(ctx) // the charge must be given back even if the caller gave up
	for i := range admitted {
		p := &admitted[i]
		if p.r.strict {
			continue
		}
		got, err := p.r.lim.Refund(ctx, p.key, p.u.hybrid, p.n)
		if err != nil || got < p.n {
			e.stats.Unrefunded.Add(p.n - got)
		}
	}
}
