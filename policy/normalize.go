package policy

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/limits"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/strict"
)

// normalized is a validated policy: each enabled rule with its units (per tier for tiered rules).
type normalized struct {
	rules []normRule
}

type normRule struct {
	rule    *Rule
	algo    Algorithm
	dims    []string          // canonical order, without "global"
	units   []unit            // untiered
	byTier  map[string][]unit // tiered
	missing MissingKey
	cost    CostFunc // resolved Func/FuncName, or nil
}

// normalize validates p and computes each enabled rule's units.
func (p *Policy) normalize(env *checkEnv) (*normalized, error) {
	if !p.MissingKey.valid() {
		return nil, p.errorf("missing_key", "missing_key %q: want reject, shared or skip", p.MissingKey)
	}
	if !p.UnknownDomain.valid() {
		return nil, p.errorf("unknown_domain", "unknown_domain %q: want reject or allow", p.UnknownDomain)
	}
	if len(p.Domain) > MaxValueLen {
		return nil, p.errorf("domain", "domain of %d bytes: at most %d", len(p.Domain), MaxValueLen)
	}
	maxRules := MaxRules
	if p.Select {
		maxRules = MaxSelectRules
	}
	if len(p.Rules) > maxRules {
		return nil, p.errorf("rules", "%d rules: at most %d", len(p.Rules), maxRules)
	}
	if p.StrictTag != "" && !knownDim(p.StrictTag, env) {
		return nil, p.errorf("strict_tag", "strict_tag %q: %s", p.StrictTag, dimHint(p.StrictTag, env))
	}
	if p.StrictTag == DimGlobal {
		return nil, p.errorf("strict_tag", "strict_tag %q: want a dimension other than global (leave it empty for one tag)", p.StrictTag)
	}
	tierNames := make([]string, 0, len(p.Tiers))
	for name := range p.Tiers {
		tierNames = append(tierNames, name)
	}
	sort.Strings(tierNames)
	for _, name := range tierNames {
		t := p.Tiers[name]
		if !validName(name, 32) {
			return nil, p.errorf("tiers", "tier %q: want a name of 1 to 32 bytes of [A-Za-z0-9_-]", name)
		}
		n := 0
		for _, w := range tierWindows {
			v := w.get(t)
			if v < 0 || v > strict.MaxLimit {
				e := p.errorf("tiers", "tier %q: per_%s %d out of range [0, %d]", name, w.suffix, v, strict.MaxLimit)
				if ps, ok := t.positions["per_"+w.suffix]; ok {
					e.Line, e.Column = ps.line, ps.column
				}
				return nil, e
			}
			if v > 0 {
				n++
			}
		}
		if n == 0 {
			e := p.errorf("tiers", "tier %q sets no quota: want at least one of per_second, per_minute, per_hour, per_day", name)
			if ps, ok := t.positions[""]; ok {
				e.Line, e.Column = ps.line, ps.column
			}
			return nil, e
		}
	}
	switch {
	case len(p.Tiers) > 0 && p.DefaultTier == "":
		return nil, p.errorf("tiers", "tiers need a default_tier, for requests whose tier is empty or unknown")
	case p.DefaultTier != "":
		if _, ok := p.Tiers[p.DefaultTier]; !ok {
			return nil, p.errorf("default_tier", "default_tier %q is not one of the tiers", p.DefaultTier)
		}
	}

	out := &normalized{}
	seen := make(map[string]int, len(p.Rules))
	strictUnits := 0
	strictTiered := 0
	for i := range p.Rules {
		r := &p.Rules[i]
		if !validName(r.ID, MaxIDLen) {
			return nil, r.errorf(p, i, "id", "id %q: want 1 to %d bytes of [A-Za-z0-9_-]", r.ID, MaxIDLen)
		}
		if j, dup := seen[r.ID]; dup {
			return nil, r.errorf(p, i, "id", "id %q already used by rules[%d]", r.ID, j)
		}
		seen[r.ID] = i
		nr, err := p.normalizeRule(i, r, env)
		if err != nil {
			return nil, err
		}
		if r.Disabled {
			continue
		}
		if nr.algo != Hybrid && !r.Shadow {
			if p.Select {
				// One rule per request: reset the sums, so each rule is checked on its own.
				strictUnits, strictTiered = 0, 0
			}
			if r.Tiered {
				strictTiered += maxUnits(nr.byTier)
			} else {
				strictUnits += len(nr.units)
			}
			if strictUnits+strictTiered > strict.MaxChecks {
				return nil, r.errorf(p, i, "algorithm", "more than %d strict counters would apply to one request (one atomic call checks at most %d); make some rules hybrid", strict.MaxChecks, strict.MaxChecks)
			}
		}
		out.rules = append(out.rules, nr)
	}
	return out, nil
}

func maxUnits(m map[string][]unit) int {
	n := 0
	for _, u := range m {
		n = max(n, len(u))
	}
	return n
}

func knownDim(d string, env *checkEnv) bool {
	if d == DimGlobal || builtinDims[d] {
		return true
	}
	if env == nil {
		return validDimName(d)
	}
	return env.dims[d]
}

func dimHint(d string, env *checkEnv) string {
	if !validDimName(d) {
		return "want a dimension name of 1 to 32 bytes of [a-z0-9_], starting with a letter"
	}
	return "unknown dimension (the built-in ones are api_key, user, ip, tenant, route, method and global; declare others with WithDimensions)"
}

func (p *Policy) normalizeRule(i int, r *Rule, env *checkEnv) (normRule, error) {
	nr := normRule{rule: r, algo: r.Algorithm, missing: r.MissingKey}
	if nr.algo == "" {
		nr.algo = Hybrid
	}
	if !r.Algorithm.valid() {
		return nr, r.errorf(p, i, "algorithm", "algorithm %q: want hybrid, token_bucket, gcra, fixed_window, sliding_window, sliding_log or upstream_window", r.Algorithm)
	}
	if !r.MissingKey.valid() {
		return nr, r.errorf(p, i, "missing_key", "missing_key %q: want reject, shared or skip", r.MissingKey)
	}
	if nr.missing == "" {
		nr.missing = p.MissingKey
	}
	if nr.missing == "" {
		nr.missing = MissingReject
	}
	if r.OnFailure < outcome.DefaultFailure || r.OnFailure > outcome.FailClosed {
		return nr, r.errorf(p, i, "on_failure", "on_failure %v: want local_fallback, fail_open or fail_closed", r.OnFailure)
	}
	if len(r.Dimensions) > MaxDimensions {
		return nr, r.errorf(p, i, "dimensions", "%d dimensions: at most %d", len(r.Dimensions), MaxDimensions)
	}
	set := make(map[string]bool, len(r.Dimensions))
	for _, d := range r.Dimensions {
		if !knownDim(d, env) {
			return nr, r.errorf(p, i, "dimensions", "dimension %q: %s", d, dimHint(d, env))
		}
		if set[d] {
			return nr, r.errorf(p, i, "dimensions", "dimension %q listed twice", d)
		}
		set[d] = true
		if d != DimGlobal {
			nr.dims = append(nr.dims, d)
		}
	}
	if set[DimGlobal] && len(nr.dims) > 0 {
		return nr, r.errorf(p, i, "dimensions", "dimension global cannot be combined with others")
	}
	sort.Strings(nr.dims)
	if p.StrictTag != "" && nr.algo != Hybrid && !r.Disabled && !set[p.StrictTag] {
		return nr, r.errorf(p, i, "dimensions", "strict rule lacks the strict_tag dimension %q: its counter would be split by %s", p.StrictTag, p.StrictTag)
	}
	for _, m := range r.Match.Methods {
		if m == "" || strings.ContainsAny(m, " \t\r\n") {
			return nr, r.errorf(p, i, "match", "match method %q: want an HTTP method", m)
		}
	}
	for _, t := range r.Match.Tiers {
		if _, ok := p.Tiers[t]; !ok {
			return nr, r.errorf(p, i, "match", "match tier %q is not one of the tiers", t)
		}
	}

	// Cost.
	c := r.Cost
	switch {
	case c.Fixed < 0:
		return nr, r.errorf(p, i, "cost", "cost %d: want at least 1", c.Fixed)
	case c.Func != nil && c.FuncName != "":
		return nr, r.errorf(p, i, "cost", "cost sets both Func and FuncName")
	case c.FuncName != "":
		if env != nil {
			f, ok := env.costFuncs[c.FuncName]
			if !ok || f == nil {
				return nr, r.errorf(p, i, "cost", "cost function %q is not in WithCostFuncs", c.FuncName)
			}
			nr.cost = f
		}
	case c.Func != nil:
		nr.cost = c.Func
	}
	for m, v := range c.PerMethod {
		if v < 1 {
			return nr, r.errorf(p, i, "cost", "cost for %s: %d: want at least 1", m, v)
		}
	}
	maxCost := max(c.Fixed, 1)
	for _, v := range c.PerMethod {
		maxCost = max(maxCost, v)
	}

	// Limits.
	forms := 0
	if r.Rate != 0 || (r.Burst != 0 && r.Limit == 0 && r.Period == 0) {
		forms++
	}
	if r.Limit != 0 || r.Period != 0 {
		forms++
	}
	if r.Tiered {
		forms++
	}
	if forms != 1 {
		return nr, r.errorf(p, i, "", "want exactly one of rate and burst, limit and period, or tiered: true")
	}
	if r.Tiered {
		if len(p.Tiers) == 0 {
			return nr, r.errorf(p, i, "tiered", "tiered rule, but the policy has no tiers")
		}
		nr.byTier = make(map[string][]unit, len(p.Tiers))
		for name, t := range p.Tiers {
			for _, w := range tierWindows {
				q := w.get(t)
				if q == 0 {
					continue
				}
				u, err := makeUnit(nr.algo, r.ID+"."+w.suffix, 0, 0, q, w.period)
				if err != nil {
					return nr, r.errorf(p, i, "tiered", "tier %q per_%s: %v", name, w.suffix, err)
				}
				if maxCost > u.limit {
					return nr, r.errorf(p, i, "cost", "cost %d exceeds tier %q's per_%s quota %d: such a request could never pass", maxCost, name, w.suffix, u.limit)
				}
				nr.byTier[name] = append(nr.byTier[name], u)
			}
		}
		return nr, nil
	}
	switch {
	case r.Rate != 0 && r.Burst == 0:
		return nr, r.errorf(p, i, "rate", "rate without burst: give the bucket size as burst")
	case r.Limit != 0 && r.Period == 0:
		return nr, r.errorf(p, i, "limit", "limit without period: give the window (or refill time) as period")
	case r.Period != 0 && r.Limit == 0:
		return nr, r.errorf(p, i, "period", "period without limit: give the units per period as limit")
	}
	u, err := makeUnit(nr.algo, r.ID, r.Rate, r.Burst, r.Limit, r.Period)
	if err != nil {
		field := "rate"
		if r.Limit != 0 || r.Period != 0 {
			field = "limit"
		}
		return nr, r.errorf(p, i, field, "%v", err)
	}
	if maxCost > u.limit {
		return nr, r.errorf(p, i, "cost", "cost %d exceeds the limit %d: such a request could never pass", maxCost, u.limit)
	}
	nr.units = []unit{u}
	return nr, nil
}

// makeUnit converts one limit to the algorithm's terms. rate/burst or limit/period is set (for Hybrid,
// burst may come with limit/period).
func makeUnit(algo Algorithm, name string, rate float64, burst, limit int64, period time.Duration) (unit, error) {
	u := unit{name: name}
	byRate := limit == 0 && period == 0
	if byRate {
		if err := limits.CheckRate(rate, burst); err != nil {
			return u, err
		}
	} else if err := limits.CheckWindow(limit, period); err != nil {
		return u, err
	}
	switch {
	case algo == Hybrid:
		if byRate {
			u.hybrid = hybrid.Limit{Rate: rate, Burst: burst}
		} else {
			b := burst
			if b == 0 {
				b = limit
			}
			u.hybrid = hybrid.Limit{Rate: float64(limit) / period.Seconds(), Burst: b}
			if err := limits.CheckRate(u.hybrid.Rate, b); err != nil {
				return u, fmt.Errorf("limit %d per %v: %w", limit, period, err)
			}
		}
		u.limit = u.hybrid.Burst
		u.window = seconds(float64(u.hybrid.Burst) / u.hybrid.Rate)
		return u, nil
	case algo.windowed() && byRate:
		return u, fmt.Errorf("algorithm %s counts per window: give limit and period, not rate and burst", algo)
	case !byRate && burst != 0:
		return u, fmt.Errorf("burst: only hybrid rules take a burst with limit and period (a strict bucket's burst is its limit)")
	}
	if byRate {
		limit = burst
		secs := float64(burst) / rate
		if secs > float64(strict.MaxPeriod)/float64(time.Second) {
			return u, fmt.Errorf("rate %v with burst %d refills in %.0fs: above the longest period %v", rate, burst, secs, strict.MaxPeriod)
		}
		period = time.Duration(secs * float64(time.Second)).Round(time.Microsecond)
	}
	u.strict = strict.Rule{Name: name, Algorithm: algo.strict(), Limit: limit, Period: period}
	if err := u.strict.Validate(); err != nil {
		return u, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), strict.ErrInvalid.Error()+": "))
	}
	u.limit, u.window = limit, period
	return u, nil
}

// seconds converts s seconds to a Duration, saturating at the largest Duration.
func seconds(s float64) time.Duration {
	if !(s*float64(time.Second) < float64(math.MaxInt64)) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}

func validName(s string, maxLen int) bool {
	if s == "" || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func validDimName(s string) bool {
	if s == "" || len(s) > 32 || !(s[0] >= 'a' && s[0] <= 'z') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func sortStrings(s []string) { sort.Strings(s) }
