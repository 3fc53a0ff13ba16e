package policy

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/strict"
)

// ErrInvalid is wrapped by every error that rejects a policy: a file that does not parse, a field of
// the wrong type or out of range, a rule that names an unknown dimension or cost function. The
// concrete error is an [*Error], which names the file and line when the policy came from a file.
var ErrInvalid = errors.New("policy: invalid policy")

// ErrBadRequest is matched (errors.Is) by every error of [Enforcer.Check] that blames the request
// rather than the limiter: [ErrUnknownDomain] and [ErrInvalidCost]. [ErrorStatus] answers it with 400.
var ErrBadRequest = errors.New("policy: bad request")

// ErrUnknownDomain is wrapped by the error [Enforcer.Check] returns for a request of a domain other
// than the policy's Domain when its UnknownDomain is DomainReject: nothing was consulted or consumed.
// It matches [ErrBadRequest].
var ErrUnknownDomain error = &badRequest{"policy: unknown domain"}

// ErrInvalidCost is wrapped by the error [Enforcer.Check] returns when a request's cost, computed by
// a [CostFunc] or given in Request.Cost, is below 1 or above a rule's limit: no rule was consulted
// and nothing was consumed. It matches [ErrBadRequest]: the request asks for more than a rule can
// ever admit.
var ErrInvalidCost error = &badRequest{"policy: invalid request cost"}

// badRequest is a sentinel error that matches ErrBadRequest.
type badRequest struct{ msg string }

func (e *badRequest) Error() string        { return e.msg }
func (e *badRequest) Is(target error) bool { return target == ErrBadRequest }

// Error is a policy that cannot be used. Line and Column are 1-based positions in File, zero when
// unknown (a policy built in Go, or a whole-file problem). It is a plain value, safe to copy and
// share.
type Error struct {
	File   string // the file name given to Parse or LoadFile; empty for a policy built in Go
	Line   int    // the line of the offending field, or 0
	Column int    // the column of the offending field, or 0
	Msg    string // what is wrong, e.g. `rule "per-key": rate: want a number above 0, got -5`
}

// Error returns "file:line:column: msg", leaving out what is unknown. It does no I/O.
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

// Unwrap returns [ErrInvalid]. It does no I/O.
func (e *Error) Unwrap() error { return ErrInvalid }

// Algorithm names how a rule counts. The empty Algorithm means [Hybrid]. It is a plain value, safe
// to copy and share.
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
	// UpstreamWindow is envoyproxy/ratelimit's fixed window (strict.UpstreamWindow): every request
	// counts, admitted or refused, and one is refused when the count after it is above the limit;
	// a check-only request (Request.CheckOnly) reads the count. It is what upstream's configuration
	// files compile to by default ([WithUpstreamAlgorithm]).
	UpstreamWindow Algorithm = "upstream_window"
)

// strict returns the central algorithm of a, or 0 for Hybrid and unknown names.
func (a Algorithm) strict() strict.Algorithm {
	switch a {
	case TokenBucket:
		return strict.TokenBucket
	case GCRA:
		return strict.GCRA
	case FixedWindow:
		return strict.FixedWindow
	case SlidingWindow:
		return strict.SlidingWindow
	case SlidingLog:
		return strict.SlidingLog
	case UpstreamWindow:
		return strict.UpstreamWindow
	}
	return 0
}

func (a Algorithm) valid() bool { return a == "" || a == Hybrid || a.strict() != 0 }

// windowed reports whether a counts per window (limit and period only; no rate/burst form).
func (a Algorithm) windowed() bool {
	return a == FixedWindow || a == SlidingWindow || a == SlidingLog || a == UpstreamWindow
}

// countsRefused reports whether a counts refused requests (and so can be read with a cost of 0).
func (a Algorithm) countsRefused() bool { return a == UpstreamWindow }

// UnknownDomain is the answer to a request of a domain the policy does not serve (see
// Policy.Domain). The empty UnknownDomain means [DomainReject]. It is a plain value, safe to copy
// and share.
type UnknownDomain string

// The answers to a request of an unknown domain.
const (
	// DomainReject makes Check fail with [ErrUnknownDomain]: nothing is consulted or consumed (the
	// sidecar answers 400, gRPC InvalidArgument, with the reason).
	DomainReject UnknownDomain = "reject"
	// DomainAllow admits the request with no limit and no Decisions, as envoyproxy/ratelimit
	// answers a domain it has no configuration for.
	DomainAllow UnknownDomain = "allow"
)

func (u UnknownDomain) valid() bool { return u == "" || u == DomainReject || u == DomainAllow }

// MissingKey says what a rule does with a request that lacks one of its dimensions (no API key
// header, no authenticated user, an unusable client address: an absent or empty value). A value is
// never missing for its length or its bytes: see MaxValueLen. The empty MissingKey inherits the
// policy's (see the constants). It is a plain value, safe to copy and share.
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
// the built-in ones from the HTTP request; [WithDimensions] declares more.
const (
	DimGlobal = "global"  // no attribute: one counter for every request the rule matches
	DimAPIKey = "api_key" // the API key
	DimUser   = "user"    // the authenticated user
	DimIP     = "ip"      // the client address
	DimTenant = "tenant"  // the tenant (organisation, account)
	DimRoute  = "route"   // the route pattern, e.g. "GET /v1/items/{id}"
	DimMethod = "method"  // the HTTP method
	// DimDescriptor is a whole Envoy rate-limit descriptor, its entries' keys and values in order:
	// the dimension the rules compiled from envoyproxy/ratelimit's configuration count per (see
	// [UpstreamConfig]).
	DimDescriptor = "descriptor"
)

var builtinDims = map[string]bool{DimAPIKey: true, DimUser: true, DimIP: true, DimTenant: true, DimRoute: true, DimMethod: true, DimDescriptor: true}

// Limits on policies, checked when a policy is set.
const (
	// MaxRules is the largest number of rules in a policy.
	MaxRules = 256
	// MaxSelectRules is the largest number of rules in a policy with Select set.
	MaxSelectRules = 1 << 16
	// MaxDimensions is the largest number of dimensions of one rule.
	MaxDimensions = 8
	// MaxValueLen is the longest dimension value, in bytes, that a rule counts under as it is
	// (percent-escaped); a longer value (say, a 10 kB API key header) counts under its SHA-256, so
	// it is limited like any other value and its own subject (Stats.LongValues counts them).
	MaxValueLen = 256
	// MaxIDLen is the longest rule id. Ids are 1 to MaxIDLen bytes of [A-Za-z0-9_-].
	MaxIDLen = 48
)

// Policy is a set of rules that apply to every request together: a request is admitted only if
// every enforced rule that matches it admits it. Build one in Go or load it with [Parse] or
// [LoadFile], and hand it to [Enforcer.SetPolicy]. A Policy is a plain value: it is not modified
// once set, and it may be reused. The zero Policy has no rules (it admits every request).
type Policy struct {
	// Domain names the domain the policy serves (Envoy's rate-limit domain; [Request.Domain]). Every
	// counter is kept per domain, so requests of different domains never share one. A request whose
	// domain is empty counts under Domain. Requests of another, non-empty domain get the
	// UnknownDomain answer. Empty (the default) serves every domain, each with its own counters. At
	// most MaxValueLen bytes.
	Domain string
	// UnknownDomain says what Check answers a request of a domain other than Domain, when Domain is
	// set: DomainReject (the default) fails with ErrUnknownDomain, DomainAllow admits with no limit.
	UnknownDomain UnknownDomain
	// Shadow puts every rule in shadow mode: rules are evaluated and count as if enforced, denials
	// are reported (WithOnShadowDeny, Stats.ShadowDenied) but every request is admitted.
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
	// Rules are the rules, at most MaxRules (MaxSelectRules with Select), with distinct ids.
	Rules []Rule
	// Select makes each request name the one rule it is checked against (Request.Rule) instead of
	// being matched against every rule: the form envoyproxy/ratelimit's descriptor trees compile to
	// ([UpstreamConfig.Policy]), where the tree, not the rules, decides which limit applies. A
	// request that names no rule, or a rule the policy does not have, is admitted with no Decisions.
	// Since one rule applies per request, the bound on the strict counters of one request holds
	// whatever the number of strict rules.
	Select bool

	file      string         // where the policy was parsed from, for error positions
	positions map[string]pos // top-level keys' positions
}

// Tier is a plan's quotas. A [Rule] with Tiered set counts each request against each quota the
// request's tier sets: a tier with PerMinute and PerHour makes the rule two counters. At least one
// quota is required. The zero Tier sets no quota, which Validate refuses. It is a plain value, safe
// to copy.
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
//
// The zero Rule is invalid (Policy.Validate says why); a Rule is a plain value, safe to copy, and
// not modified once its Policy is set.
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
	// OnFailure says what the rule answers when Redis cannot: outcome.LocalFallback enforces the rule in this
	// process at its share of the limit, outcome.FailOpen admits, outcome.FailClosed denies. The zero value,
	// outcome.DefaultFailure, means outcome.LocalFallback.
	OnFailure outcome.FailurePolicy
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
// empty list matches every value. The zero Match matches every request. It is a plain value, safe
// to copy.
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
// PerMethod, then Fixed. The zero Cost is 1 per request. It is a plain value, safe to copy; Func is
// called from many goroutines at once.
type Cost struct {
	// Fixed is the cost of every request; 0 means 1.
	Fixed int64
	// PerMethod is the cost by HTTP method (upper case); requests with other methods cost Fixed.
	PerMethod map[string]int64
	// Func computes the cost of each request (Go only).
	Func CostFunc
	// FuncName names a function of WithCostFuncs (the file form: `cost: {func: name}`).
	FuncName string
}

// CostFunc computes a request's cost under a rule. It must return 1 to the rule's limit; any other
// answer makes [Enforcer.Check] fail with [ErrInvalidCost] before anything is consumed. It runs on
// the request's goroutine, once per rule per request. The zero (nil) CostFunc is refused by
// NewEnforcer. It is called from many goroutines at once: it must be safe for concurrent use.
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
// custom dimensions and cost function names are known. It does no I/O.
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
	strict strict.Rule   // for the strict algorithms
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
