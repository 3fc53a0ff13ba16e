package policy

import (
	"context"

	"github.com/hybridrate/hybridrate/strict"
)

// ShadowEvent reports a would-be denial: a rule in shadow mode denied, or any rule denied while the
// whole policy is in shadow mode. It is a plain value, the callback's to keep; safe to copy. The
// zero ShadowEvent is empty.
type ShadowEvent struct {
	// Rule and Unit name the counter; Decision is its answer.
	Rule, Unit string
	// Tier is the tier the request was counted under.
	Tier string
	// Key is the counter's key as stored in Redis (hashed when WithHashKey is given), without the
	// prefix.
	Key string
	// Decision is the counter's answer.
	Decision Decision
	// Global reports that the rule is enforced but the policy is in shadow mode.
	Global bool
	// MissingKey reports that the rule would have rejected the request for a missing dimension.
	MissingKey bool
}

// denied finishes a request that a counter denied: in shadow mode it reports the denials, admits the
// request and evaluates the shadow rules; otherwise it returns res as is. counters are the plan's.
func (e *Enforcer) denied(ctx context.Context, c *compiled, pl plan, counters []planned, res Result) Result {
	if !c.shadowAll {
		return res
	}
	for _, d := range res.Decisions {
		if d.Allowed {
			continue
		}
		key := ""
		for i := range counters {
			if counters[i].u.name == d.Unit {
				key = counters[i].key
				break
			}
		}
		e.shadowEvent(ShadowEvent{Rule: d.Rule, Unit: d.Unit, Tier: pl.tier, Key: key, Decision: d, Global: true})
	}
	res.Allowed, res.ShadowDenied = true, true
	e.evalShadow(ctx, pl, counters[pl.nEnforced:], &res)
	return res
}

// evalShadow consults each shadow rule on its own, reporting its denials. Errors are counted, never
// returned: a shadow rule cannot affect the request. Strict shadow rules use the request's tag, so
// their counters are the ones the rule would use if enforced.
func (e *Enforcer) evalShadow(ctx context.Context, pl plan, shadow []planned, res *Result) {
	for i := range shadow {
		p := &shadow[i]
		var d Decision
		if p.r.strict {
			m, err := e.allowStrict(ctx, pl.tag, []strict.Check{{Rule: p.u.strict, Subject: p.sub(), N: p.n}})
			if err != nil {
				e.stats.Errors.Add(1)
				continue
			}
			d = strictDecision(p, m, 0)
		} else {
			hd, err := p.r.lim.DecideN(ctx, p.key, p.u.hybrid, p.n)
			if err != nil {
				e.stats.Errors.Add(1)
				continue
			}
			d = hybridDecision(p, hd)
		}
		d.Shadow = true
		res.Decisions = append(res.Decisions, d)
		if !d.Allowed {
			e.shadowEvent(ShadowEvent{Rule: d.Rule, Unit: d.Unit, Tier: pl.tier, Key: p.key, Decision: d})
		}
	}
}

// shadowEvent counts a would-be denial and reports it to WithOnShadowDeny.
func (e *Enforcer) shadowEvent(ev ShadowEvent) {
	e.stats.ShadowDenied.Add(1)
	if e.cfg.OnShadowDeny != nil {
		e.cfg.OnShadowDeny(ev)
	}
}
