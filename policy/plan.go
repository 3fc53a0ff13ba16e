package policy

import (
	"fmt"
	"strings"
	"unsafe"
)

// plan describes the counters a request is checked against. The counters themselves, in the order
// Check consults them (the enforced ones, hybrid ones narrowest first, then strict ones; then the
// shadow ones), are a slice beside it, backed by an array on Check's stack: a plan holds no pointer
// to them because Go's escape analysis does not tell fields apart, and the strings below reach the
// heap (shadow events, Redis calls).
type plan struct {
	tier          string // the tier the request counts under
	domain        string // the domain the request counts under
	tag           string // the hash tag of the request's strict keys; set when a strict rule applies
	nEnforced     int    // counters[:nEnforced] are enforced, the rest shadow
	nStrict       int    // enforced strict counters
	missingShadow bool   // shadow mode hid a missing-key rejection
	missing       string // the rule that rejects the request for a missing key, if any
}

// makePlan returns the plan of req under c and its counters, appended to buf. When an enforced rule
// lacks a dimension of the request and rejects such requests, the plan's missing names it and the
// plan stops there; err is non-nil when the request's cost is invalid. Nothing is consumed either way.
//
// Keys are built in kb when it has room (borrowed: see keyBuf) and allocated otherwise; kb may be
// nil.
func (e *Enforcer) makePlan(c *compiled, req *Request, buf []planned, kb *keyBuf) (plan, []planned, error) {
	pl := plan{tier: c.defaultTier, domain: req.Domain}
	if pl.domain == "" {
		pl.domain = c.domain
	}
	if len(c.tiers) > 0 && c.tiers[req.Tier] {
		pl.tier = req.Tier
	}
	var route string
	var routeOK bool
	if c.needRoute && req.Dims != nil {
		route, routeOK = req.Dims.Dimension(DimRoute)
	}
	counters := buf
	var err error
	if c.byID != nil || c.src.Select {
		// One rule, named by the request: the tree that named it has decided that it applies.
		r := c.byID[req.Rule]
		if r == nil {
			return pl, counters, nil
		}
		if counters, err = e.planRule(c, r, req, &pl, counters, kb); err != nil || pl.missing != "" {
			return pl, counters, err
		}
		if !r.shadow {
			pl.nEnforced = len(counters)
		}
		return pl, counters, nil
	}
	for _, r := range c.enforced {
		if r.matches(req.Method, route, routeOK, pl.tier) {
			if counters, err = e.planRule(c, r, req, &pl, counters, kb); err != nil || pl.missing != "" {
				return pl, counters, err
			}
		}
	}
	pl.nEnforced = len(counters)
	for _, r := range c.shadow {
		if r.matches(req.Method, route, routeOK, pl.tier) {
			if counters, err = e.planRule(c, r, req, &pl, counters, kb); err != nil {
				return pl, counters, err
			}
		}
	}
	return pl, counters, nil
}

// planRule appends to counters those of r, a rule that applies to req: one per unit (a tiered rule
// has one per quota of the request's tier), keyed by the request's subject. See makePlan.
func (e *Enforcer) planRule(c *compiled, r *crule, req *Request, pl *plan, counters []planned, kb *keyBuf) ([]planned, error) {
	units := r.units
	if r.byTier != nil {
		units = r.byTier[pl.tier]
	}
	if len(units) == 0 {
		return counters, nil
	}
	var sbuf [192]byte
	subject, ok := e.subject(r, pl.domain, req, &sbuf)
	if !ok {
		if r.shadow || r.missing == MissingSkip {
			return counters, nil // shadow rules never deny, not even for a missing key
		}
		e.stats.MissingKey.Add(1)
		if c.shadowAll {
			pl.missingShadow = true
			e.shadowEvent(ShadowEvent{Rule: r.id, Unit: units[0].name, Tier: pl.tier, Global: true, MissingKey: true,
				Decision: Decision{Rule: r.id, Unit: units[0].name, Algorithm: r.algo}})
			return counters, nil
		}
		pl.missing = r.id
		return counters, nil
	}
	n, err := r.cost(req)
	if err != nil {
		return counters, err
	}
	if r.strict && pl.tag == "" {
		pl.tag = e.tag(c, req)
	}
	for i := range units {
		u := &units[i]
		if n > u.limit && !r.algo.countsRefused() { // a window that counts refused hits refuses it itself
			return counters, fmt.Errorf("%w: rule %q: cost %d above its limit %d", ErrInvalidCost, r.id, n, u.limit)
		}
		key, borrowed := kb.key(u.name, subject) // the subject is a slice of the key
		counters = append(counters, planned{r: r, u: u, key: key, n: n, borrowed: borrowed})
		if r.strict && !r.shadow {
			pl.nStrict++
		}
	}
	return counters, nil
}

// decisions returns the storage for the Decisions of a request with the given number of counters:
// req.Decisions emptied when its capacity suffices, else a new slice.
func decisions(req *Request, counters int) []Decision {
	if cap(req.Decisions) >= counters {
		return req.Decisions[:0]
	}
	return make([]Decision, 0, counters)
}

// planned is one counter to consult for a request.
type planned struct {
	r        *crule
	u        *unit
	key      string // unit name + ":" + subject
	n        int64
	borrowed bool // key is over a keyBuf: valid only during the Check (see keyBuf)
}

// keyBufBytes is the room for a request's counter keys in a keyBuf; a key that does not fit is
// allocated.
const keyBufBytes = 512

// keyBuf is pooled storage (Enforcer.keyBufs) for the counter keys of one Check, so that a request
// decided locally allocates no key: the hybrid fast path (hybrid.Limiter.DecideLocalN) and the
// memo's lookups take a key without keeping it. A key over a keyBuf is borrowed: before any call
// that may keep a key (hybrid's DecideN, Peek and Refund, the memo's add, strict calls and their
// fallbacks, shadow events), Check owns every key of the request with ownKeys, and it returns the
// keyBuf to the pool only when no borrowed key was handed to such a call. A keyBuf not returned (an
// early return, a panic) is left to the collector.
type keyBuf struct {
	n int
	b [keyBufBytes]byte
}

// getKeyBuf returns an empty keyBuf from the pool.
func (e *Enforcer) getKeyBuf() *keyBuf {
	kb, _ := e.keyBufs.Get().(*keyBuf)
	if kb == nil {
		kb = new(keyBuf)
	}
	kb.n = 0
	return kb
}

// key returns name + ":" + subject: over kb's storage when it has room (borrowed), else allocated.
// kb may be nil.
func (kb *keyBuf) key(name string, subject []byte) (key string, borrowed bool) {
	size := len(name) + 1 + len(subject)
	if kb == nil || size > len(kb.b)-kb.n {
		return name + ":" + string(subject), false // one allocation
	}
	b := kb.b[kb.n : kb.n+size]
	copy(b[copy(b, name)+1:], subject)
	b[len(name)] = ':'
	kb.n += size
	return unsafe.String(&b[0], size), true
}

// ownKeys replaces every borrowed key of counters by a copy of its own.
func ownKeys(counters []planned) {
	for i := range counters {
		if p := &counters[i]; p.borrowed {
			p.key, p.borrowed = strings.Clone(p.key), false
		}
	}
}

// sub returns the subject part of the key (hashed when configured).
func (p *planned) sub() string { return p.key[len(p.u.name)+1:] }

// matches reports whether the rule applies to a request.
func (r *crule) matches(method, route string, routeOK bool, tier string) bool {
	if r.routes != nil && (!routeOK || !r.routes[route]) {
		return false
	}
	if r.methods != nil {
		ok := false
		for _, m := range r.methods {
			if strings.EqualFold(m, method) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return r.tiers == nil || r.tiers[tier]
}

// cost returns the request's cost under r.
func (r *crule) cost(req *Request) (int64, error) {
	if req.CheckOnly {
		if r.algo.countsRefused() {
			return 0, nil // a read of the count
		}
		return 1, nil
	}
	if req.Cost > 0 && !r.ownCost {
		return req.Cost, nil
	}
	if r.costFunc != nil {
		n := r.costFunc(req)
		if n < 1 {
			return 0, fmt.Errorf("%w: rule %q: cost function returned %d", ErrInvalidCost, r.id, n)
		}
		return n, nil
	}
	if r.perMethod != nil {
		if n, ok := r.perMethod[req.Method]; ok {
			return n, nil
		}
		if n, ok := r.perMethod[strings.ToUpper(req.Method)]; ok {
			return n, nil
		}
	}
	return r.fixed, nil
}
