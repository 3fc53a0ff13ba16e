package policy

import (
	"time"

	"github.com/hybridrate/hybridrate/outcome"
)

// Decision is one counter's answer for a request. The zero Decision denies. It is a plain value,
// safe to copy.
type Decision struct {
	// Rule is the rule id.
	Rule string
	// Unit names the counter: the rule id, or "<id>.<window>" (second, minute, hour, day) for a
	// tiered rule's quota.
	Unit string
	// Algorithm is the rule's algorithm.
	Algorithm Algorithm
	// Shadow reports that the rule was evaluated in shadow mode: it never denies.
	Shadow bool
	// Allowed reports whether the counter had room. A strict counter that had room still counted
	// nothing when another rule denied the request.
	Allowed bool
	// Limit is the quota (a bucket's burst, a window's limit).
	Limit int64
	// Window is the time in which the quota refills (a bucket's Burst/Rate, a window's Period).
	Window time.Duration
	// Remaining estimates the units left (exact for strict rules and hybrid central decisions).
	Remaining int64
	// Excess is, for an upstream_window rule, how far its count is above Limit (refused units
	// included); 0 otherwise.
	Excess int64
	// RetryAfter is how long until the request's cost would fit, when not Allowed.
	RetryAfter time.Duration
	// ResetAfter estimates how long until the quota is full again.
	ResetAfter time.Duration
	// Source says who decided.
	Source outcome.Source
	// Unavailable reports a denial made only because Redis could not answer and the rule fails
	// closed (on_failure: fail_closed): it says nothing about the subject's quota.
	Unavailable bool
}

// Result is the outcome of [Enforcer.Check]. The zero Result denies. A Result is the caller's:
// Check does not touch it (or its Decisions) once returned, so it may be read from any goroutine.
type Result struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Rule is, when the request is denied (or would have been, in shadow mode), the id of the rule
	// that denied it: the one with the longest RetryAfter when several did, or the rule that lacked a
	// key.
	Rule string
	// RetryAfter is how long to wait before retrying, when denied.
	RetryAfter time.Duration
	// MissingKey reports that Rule lacks a dimension of the request and rejects such requests
	// (MissingReject); nothing was consumed.
	MissingKey bool
	// Unavailable reports that the denying rule's decision is a fail-closed fallback (see
	// Decision.Unavailable): the limiter could not decide, rather than the subject being over its
	// limit. The middleware answers such denials with 503 rather than 429.
	Unavailable bool
	// ShadowDenied reports that the policy is in shadow mode and would have denied the request
	// (Allowed is then true).
	ShadowDenied bool
	// Decisions are the counters consulted, in evaluation order: enforced rules, then shadow ones.
	// Rules after a denying one are not consulted.
	Decisions []Decision
}

// decision returns the counter's Decision with the fields every source fills in.
func (p *planned) decision(allowed bool, src outcome.Source) Decision {
	return Decision{Rule: p.r.id, Unit: p.u.name, Algorithm: p.r.algo, Allowed: allowed, Limit: p.u.limit,
		Window: p.u.window, Source: src}
}

// denyWorst denies res for the decision of res.Decisions[from:] that denied with the longest
// RetryAfter (the first of those in a tie); one of them must deny.
func (res *Result) denyWorst(from int) {
	var worst *Decision
	for i := from; i < len(res.Decisions); i++ {
		if d := &res.Decisions[i]; !d.Allowed && (worst == nil || d.RetryAfter > worst.RetryAfter) {
			worst = d
		}
	}
	res.Allowed, res.Rule, res.RetryAfter, res.Unavailable = false, worst.Rule, worst.RetryAfter, worst.Unavailable
}
