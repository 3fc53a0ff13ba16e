package policy

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/hybrid"
)

// ErrInvalid is wrapped by every error that rejects a policy: a file that does not parse, a field of
// the wrong type or out of range, a rule that names an unknown dimension or cost function. The
// concrete error is an [*Error], which names the file and line when the policy came from a file.
var ErrInvalid = errors.New("policy: invalid policy")

// ErrInvalidCost is wrapped by the error [Enforcer.Check] returns when a request's cost, computed by
// a [CostFunc], is below 1 or above a rule's limit: no rule was consulted and nothing was consumed.
var ErrInvalidCost = errors.New("policy: invalid request cost")

// Error is a policy that cannot be used. Line and Column are 1-based positions in File, zero when
// unknown (a policy built in Go, or a whole-file problem).
type Error struct {
	File   string // the file name given to Parse or LoadFile; empty for a policy built in Go
	Line   int    // the line of the offending field, or 0
	Column int    // the column of the offending field, or 0
	Msg    string // what is wrong, e.g. `rule "per-key": rate: want a number above 0, got -5`
}

// Error returns "file:line:column: msg", leaving out what is unknown.
func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0 && e.Column > 0:
		fmt.Fprintf(&b, "%s:%d:%d: ", e.File, e.Line, e.Column)
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s:%d: ", e.File, e.Line)
	case e.File != "":
		fmt.Fprintf(&b, "%s: ", e.File)
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d: ", e.Line)
	default:
		b.WriteString("policy: ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns [ErrInvalid].
func (e *Error) Unwrap() error { return ErrInvalid }

// Algorithm names how a rule counts. The empty Algorithm means [Hybrid].
type Algorithm string

// The algorithms. Hybrid is hybridrate's local-first token bucket (package hybrid): nanosecond
// decisions, one global limit with the bounded overshoot of docs/accuracy.md. The others are the
// strict central algorithms of package central (docs/algorithms.md): exact, one Redis round trip per
// request for all the strict rules of the request together.
const (
	Hybrid        Algorithm = "hybrid"
	TokenBucket   Algorithm = "token_bucket"
	GCRA          Algorithm = "gcra"
	FixedWindow   Algorithm = "fixed_window"
	SlidingWindow Algorithm = "sliding_window"
	SlidingLog    Algorithm = "sliding_log"
)

// strict returns the central algorithm of a, or 0 for Hybrid and unknown names.
func (a Algorithm) strict() central.Algorithm {
	switch a {
	case TokenBucket:
		return central.TokenBucket
	case GCRA:
		return central.GCRA
	case FixedWindow:
		return central.FixedWindow
	case SlidingWindow:
		return central.SlidingWindow
	case SlidingLog:
		return central.SlidingLog
	}
	return 0
}

func (a Algorithm) valid() bool { return a == "" || a == Hybrid || a.strict() != 0 }

// windowed reports whether a counts per window (limit and period only; no rate/burst form).
func (a Algorithm) windowed() bool {
	return a == FixedWindow || a == SlidingWindow || a == SlidingLog
}

// MissingKey says what a rule does with a request that lacks one of its dimensions (no API key
// header, no authenticated user, an unusable client address, a value longer than MaxValueLen).
type MissingKey string

// The answers to a missing key. The empty MissingKey inherits the policy's, whose empty value means
// [MissingReject].
const (
	// MissingReject refuses the request before any rule consumes anything; the middleware answers
	// 401 by default.
	MissingReject MissingKey = "reject"
	// MissingShared counts the request in one shared anonymous bucket per rule (the missing
	// dimensions take the value "anonymous", which no real value can collide with).
	MissingShared MissingKey = "shared"
	// MissingSkip leaves the rule out for this request.
	MissingSkip MissingKey = "skip"
)

func (m MissingKey) valid() bool {
	return m == "" || m == MissingReject || m == MissingShared || m == MissingSkip
}

// The built-in dimensions. A rule's Dimensions name the request attributes its counter is kept per;
// no dimensions (or only DimGlobal) means one counter for every request. Package middleware fills
// the built-in ones from the HTTP request; [Config.Dimensions] declares more.
const (
	DimGlobal = "global"  // no attribute: one counter for every request the rule matches
	DimAPIKey = "api_key" // the API key
	DimUser   = "user"    // the authenticated user
	DimIP     = "ip"      // the client address
	DimTenant = "tenant"  // the tenant (organisation, account)
	DimRoute  = "route"   // the route pattern, e.g. "GET /v1/items/{id}"
	DimMethod = "method"  // the HTTP method
)

var builtinDims = map[string]bool{DimAPIKey: true, DimUser: true, DimIP: true, DimTenant: true, DimRoute: true, DimMethod: true}

// Limits on policies, checked when a policy is set.
const (
	// MaxRules is the largest number of rules in a policy.
	MaxRules = 256
	// MaxDimensions is the largest number of dimensions of one rule.
	MaxDimensions = 8
	// MaxValueLen is the longest dimension value, in bytes, that a rule will count under; a longer
	// value (say, a 10 kB API key header) is treated as missing.
	MaxValueLen = 256
	// MaxIDLen is the longest rule id. Ids are 1 to MaxIDLen bytes of [A-Za-z0-9_-].
	MaxIDLen = 48
)

// Policy is a set of rules that apply to every request together: a request is admitted only if
// every enforced rule that matches it admits it. Build one in Go or load it with [Parse] or
// [LoadFile], and hand it to [Enforcer.SetPolicy]. A Policy is a plain value: it is not modified
// once set, and it may be reused.
type Policy struct {
	// Shadow puts every rule in shadow mode: rules are evaluated and count as if enforced, denials
	// are reported (Config.OnShadowDeny, Stats.ShadowDenied) but every request is admitted.
	Shadow bool
	// MissingKey is the default answer of rules to a request that lacks one of their dimensions;
	// empty means MissingReject.
	MissingKey MissingKey
	// StrictTag, when set, names a dimension (typically "tenant") whose value becomes the Redis
	// Cluster hash tag of the strict rules' keys, so different tenants' strict counters spread over
	// the cluster. Every enabled strict rule must then include that dimension. Empty (the default)
	// keeps all strict counters under one constant tag: one slot, so every strict rule of a request,
	// global ones included, is checked in one atomic call.
	StrictTag string
	// DefaultTier is the tier of requests whose tier is empty or unknown; required when Tiers is set.
	DefaultTier string
	// Tiers are the plans whose quotas tiered rules apply, by name (e.g. "free", "pro").
	Tiers map[string]Tier
	// Rules are the rules, at most MaxRules, with distinct ids.
	Rules []Rule

	file      string         // where the policy was parsed from, for error positions
	positions map[string]pos // top-level keys' positions
}

// Tier is a plan's quotas. A [Rule] with Tiered set counts each request against each quota the
// request's tier sets: a tier with PerMinute and PerHour makes the rule two counters. At least one
// quota is required.
type Tier struct {
	PerSecond int64 // requests (cost units) per second; 0: no per-second quota
	PerMinute int64 // per minute; 0: none
	PerHour   int64 // per hour; 0: none
	PerDay    int64 // per day; 0: none

	positions map[string]pos
}

// Rule is one limit.
//
// # Limits
//
// A rule gives its limit in exactly one of three forms:
//   - Rate and Burst: Rate tokens per second refill a bucket of Burst. For Hybrid, TokenBucket and
//     GCRA (a strict bucket becomes Limit = Burst, Period = Burst/Rate).
//   - Limit and Period: Limit units per Period. For every algorithm: the window of the window
//     algorithms, the time a bucket takes to refill Limit tokens (a Hybrid rule may also set Burst,
//     which defaults to Limit).
//   - Tiered: the quotas of the request's [Tier].
type Rule struct {
	// ID names the rule in responses, headers, events and Redis keys: 1 to MaxIDLen bytes of
	// [A-Za-z0-9_-], unique in the policy. Changing it starts the rule's counters afresh.
	ID string
	// Algorithm selects how the rule counts; empty means Hybrid.
	Algorithm Algorithm
	// Dimensions are what the rule counts per, e.g. ["tenant", "route"]; their order does not matter
	// (keys list them in a fixed order). Empty means one global counter.
	Dimensions []string
	// Match restricts the rule to some requests; the zero Match matches every request.
	Match Match
	// Rate is the refill rate in tokens per second, with Burst.
	Rate float64
	// Burst is the bucket size, with Rate (or, for Hybrid, with Limit and Period).
	Burst int64
	// Limit is the units admitted per Period.
	Limit int64
	// Period is the window, or the time to refill Limit.
	Period time.Duration
	// Tiered takes the limits from the request's tier.
	Tiered bool
	// Cost is what one request costs under this rule; the zero Cost is 1.
	Cost Cost
	// OnFailure says what the rule answers when Redis cannot: LocalFallback (the zero value) enforces
	// the rule in this process at its share of the limit, FailOpen admits, FailClosed denies.
	OnFailure hybrid.FailurePolicy
	// Disabled turns the rule off without deleting it ("enabled: false" in a file).
	Disabled bool
	// Shadow evaluates the rule without ever denying: would-be denials are reported.
	Shadow bool
	// MissingKey overrides the policy's MissingKey for this rule.
	MissingKey MissingKey

	line, column int            // the rule's position in its file
	positions    map[string]pos // its fields' positions
}

// Match restricts a rule to some requests. Each non-empty list must contain the request's value; an
// empty list matches every value.
type Match struct {
	// Routes are route patterns, compared exactly with the request's "route" dimension (in package
	// middleware, the pattern the request was routed by, e.g. "POST /v1/exports").
	Routes []string
	// Methods are HTTP methods, compared without regard to case.
	Methods []string
	// Tiers are tier names.
	Tiers []string
}

// Cost is what one request costs under a rule, in the rule's units. At most one of Fixed, PerMethod
// and Func (or FuncName) is used, in that order of precedence: Func or FuncName if set, then
// PerMethod, then Fixed. The zero Cost is 1 per request.
type Cost struct {
	// Fixed is the cost of every request; 0 means 1.
	Fixed int64
	// PerMethod is the cost by HTTP method (upper case); requests with other methods cost Fixed.
	PerMethod map[string]int64
	// Func computes the cost of each request (Go only).
	Func CostFunc
	// FuncName names a function of Config.CostFuncs (the file form: `cost: {func: name}`).
	FuncName string
}

// CostFunc computes a request's cost under a rule. It must return 1 to the rule's limit; any other
// answer makes [Enforcer.Check] fail with [ErrInvalidCost] before anything is consumed. It runs on
// the request's goroutine, once per rule per request.
type CostFunc func(r *Request) int64

// pos is a position in a file.
type pos struct{ line, column int }

// errorf returns an *Error positioned at the given top-level field of p, if known.
func (p *Policy) errorf(field string, format string, args ...any) *Error {
	e := &Error{File: p.file, Msg: fmt.Sprintf(format, args...)}
	if ps, ok := p.positions[field]; ok {
		e.Line, e.Column = ps.line, ps.column
	}
	return e
}

// errorf returns an *Error for rule r (the i-th), positioned at its field if known, else at the rule.
func (r *Rule) errorf(p *Policy, i int, field string, format string, args ...any) *Error {
	name := fmt.Sprintf("rules[%d]", i)
	if r.ID != "" {
		name = fmt.Sprintf("rule %q", r.ID)
	}
	e := &Error{File: p.file, Line: r.line, Column: r.column, Msg: name + ": " + fmt.Sprintf(format, args...)}
	if ps, ok := r.positions[field]; ok {
		e.Line, e.Column = ps.line, ps.column
	}
	return e
}

// Validate reports the first reason p cannot be used, as an [*Error], or nil. It checks everything
// that does not depend on an [Enforcer]'s configuration; [Enforcer.SetPolicy] also checks that
// custom dimensions and cost function names are known.
func (p *Policy) Validate() error {
	if p == nil {
		return &Error{Msg: "nil policy"}
	}
	_, err := p.normalize(nil)
	return err
}

// unit is one counter of a rule: the rule itself, or one of a tiered rule's quotas.
type unit struct {
	name   string        // "per-key", or "per-key.minute" for a tier's quota
	hybrid hybrid.Limit  // for Hybrid
	strict central.Rule  // for the strict algorithms
	limit  int64         // the quota, for headers (Burst of a bucket)
	window time.Duration // the time the quota refills, for headers
}

var tierWindows = []struct {
	suffix string
	period time.Duration
	get    func(Tier) int64
}{
	{"second", time.Second, func(t Tier) int64 { return t.PerSecond }},
	{"minute", time.Minute, func(t Tier) int64 { return t.PerMinute }},
	{"hour", time.Hour, func(t Tier) int64 { return t.PerHour }},
	{"day", 24 * time.Hour, func(t Tier) int64 { return t.PerDay }},
}

// checkEnv is what normalize needs from an Enforcer; nil checks only what does not depend on one.
type checkEnv struct {
	dims      map[string]bool
	costFuncs map[string]CostFunc
}

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
	if len(p.Rules) > MaxRules {
		return nil, p.errorf("rules", "%d rules: at most %d", len(p.Rules), MaxRules)
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
			if v < 0 || v > central.MaxStrictLimit {
				e := p.errorf("tiers", "tier %q: per_%s %d out of range [0, %d]", name, w.suffix, v, central.MaxStrictLimit)
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
			if r.Tiered {
				strictTiered += maxUnits(nr.byTier)
			} else {
				strictUnits += len(nr.units)
			}
			if strictUnits+strictTiered > central.MaxStrictChecks {
				return nil, r.errorf(p, i, "algorithm", "more than %d strict counters would apply to one request (one atomic call checks at most %d); make some rules hybrid", central.MaxStrictChecks, central.MaxStrictChecks)
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
	return "unknown dimension (the built-in ones are api_key, user, ip, tenant, route, method and global; declare others in Config.Dimensions)"
}

func (p *Policy) normalizeRule(i int, r *Rule, env *checkEnv) (normRule, error) {
	nr := normRule{rule: r, algo: r.Algorithm, missing: r.MissingKey}
	if nr.algo == "" {
		nr.algo = Hybrid
	}
	if !r.Algorithm.valid() {
		return nr, r.errorf(p, i, "algorithm", "algorithm %q: want hybrid, token_bucket, gcra, fixed_window, sliding_window or sliding_log", r.Algorithm)
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
	if r.OnFailure < hybrid.LocalFallback || r.OnFailure > hybrid.FailClosed {
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
				return nr, r.errorf(p, i, "cost", "cost function %q is not in Config.CostFuncs", c.FuncName)
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
		switch {
		case math.IsNaN(rate) || math.IsInf(rate, 0) || rate < central.MinRate || rate > 1e9:
			return u, fmt.Errorf("rate %v: want a number from %v to 1e9 (tokens per second)", rate, central.MinRate)
		case burst < 1 || burst > 1e9:
			return u, fmt.Errorf("burst %d: want 1 to 1e9", burst)
		}
	} else {
		switch {
		case limit < 1 || limit > central.MaxStrictLimit:
			return u, fmt.Errorf("limit %d: want 1 to %d", limit, int64(central.MaxStrictLimit))
		case period < central.MinStrictPeriod || period > central.MaxStrictPeriod:
			return u, fmt.Errorf("period %v: want %v to %v", period, central.MinStrictPeriod, central.MaxStrictPeriod)
		}
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
			if b < 1 || b > 1e9 {
				return u, fmt.Errorf("burst %d: want 1 to 1e9", b)
			}
			u.hybrid = hybrid.Limit{Rate: float64(limit) / period.Seconds(), Burst: b}
			if u.hybrid.Rate < central.MinRate || u.hybrid.Rate > 1e9 {
				return u, fmt.Errorf("limit %d per %v is a rate of %v tokens/s: want %v to 1e9", limit, period, u.hybrid.Rate, central.MinRate)
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
		if secs > float64(central.MaxStrictPeriod)/float64(time.Second) {
			return u, fmt.Errorf("rate %v with burst %d refills in %.0fs: above the longest period %v", rate, burst, secs, central.MaxStrictPeriod)
		}
		period = time.Duration(secs * float64(time.Second)).Round(time.Microsecond)
	}
	u.strict = central.Rule{Name: name, Algorithm: algo.strict(), Limit: limit, Period: period}
	if err := u.strict.Validate(); err != nil {
		return u, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), central.ErrInvalid.Error()+": "))
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
