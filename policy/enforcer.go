package policy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/hybrid"
)

// Errors of the Enforcer.
var (
	// ErrClosed is returned by Check and SetPolicy after Close.
	ErrClosed = errors.New("policy: enforcer closed")
	// ErrNoPolicy is returned by Check before the first successful SetPolicy.
	ErrNoPolicy = errors.New("policy: no policy set")
)

// Defaults of [Config].
const (
	DefaultStrictTimeout = 50 * time.Millisecond
	DefaultMaxMemo       = 1 << 16
	// strictTag is the hash tag of every strict key when Policy.StrictTag is empty.
	strictTag = "policy"
	// anonymous is the value of a missing dimension under MissingShared; escaped values never
	// contain '*', so no real value collides with it.
	anonymous = "*"
	// maxSubject is the longest subject stored as is; longer ones are replaced by their SHA-256.
	maxSubject = 512
	// strictBreakerThreshold and strictBreakerCooldown configure the strict client's breaker, as the
	// hybrid limiter's.
	strictBreakerThreshold = 5
	strictBreakerCooldown  = 500 * time.Millisecond
	// maxFallback bounds the local limiters of strict rules under LocalFallback.
	maxFallback = 1 << 16
)

// Config configures an [Enforcer]. Redis is required; every other field has a default.
type Config struct {
	// Redis holds the counters: a *redis.Client, a Sentinel failover client or a *redis.ClusterClient.
	// Strict rules are not idempotent under go-redis's retries (a re-sent script may count twice,
	// never admit twice); MaxRetries: -1 keeps each charge single (see central.StrictConfig).
	Redis redis.UniversalClient
	// Prefix starts every Redis key (hybrid and strict); the default is hybrid.DefaultKeyPrefix.
	Prefix string
	// HybridOptions are passed to hybrid.New for the hybrid rules' limiters (one per failure policy
	// in use, created when a policy first needs it), before the Enforcer's own WithKeyPrefix and
	// WithFailurePolicy. On miniredis, pass hybrid.WithSyncTimeout(time.Second): its Lua is slow.
	HybridOptions []hybrid.Option
	// StrictTimeout bounds one strict Redis call; the default is 50ms. A call that times out is
	// answered by each rule's failure policy.
	StrictTimeout time.Duration
	// HashKey, when not empty, keys an HMAC-SHA-256 of every subject (the dimension values of a
	// request), so no raw API key, user id, e-mail or IP address reaches Redis: keys hold the first 16
	// bytes of the MAC, in hex. Changing the key starts every counter afresh. Optional.
	HashKey []byte
	// Dimensions declares dimensions beyond the built-in ones (names of 1 to 32 bytes of [a-z0-9_]
	// starting with a letter), for package middleware's WithDimension or a Go caller's Request.
	Dimensions []string
	// CostFuncs are the cost functions a policy file may name (`cost: {func: name}`).
	CostFuncs map[string]CostFunc
	// OnShadowDeny, when set, is called for each would-be denial of a rule in shadow mode (or of any
	// rule while the policy is in shadow mode), on the request's goroutine: keep it fast.
	OnShadowDeny func(ShadowEvent)
	// FallbackNodes is the number of processes that share a strict rule's limit while Redis is away:
	// under LocalFallback each process enforces Limit/FallbackNodes locally. The default is 1. (Hybrid
	// rules use the node count the limiter last saw.)
	FallbackNodes int
	// MaxMemo bounds the denials remembered until their retry-after (see docs/policies.md,
	// "Hierarchy"); the default is 65536. Negative disables the memo.
	MaxMemo int
	// Now is the clock of the memo and of local fallbacks; nil means time.Now. Limits themselves run on
	// Redis TIME.
	Now func() time.Time
	// Logger receives background errors of the hybrid limiters; nil discards them.
	Logger *slog.Logger
}

// Request is what an [Enforcer] decides on. Package middleware builds one per HTTP request.
type Request struct {
	// Method is the HTTP method (for per-method costs and Match.Methods), or empty.
	Method string
	// Tier is the request's tier name; empty or unknown means the policy's DefaultTier.
	Tier string
	// Dims gives the request's dimension values; nil means none (every dimension is missing).
	Dims Dimensions
	// HTTP is the HTTP request when there is one (for cost functions); nil otherwise.
	HTTP *http.Request
	// Decisions is optional storage for the Result's Decisions: when its capacity suffices, Check
	// appends to Decisions[:0] rather than allocating, and the Result shares its array.
	Decisions []Decision
}

// Dimensions gives a request's dimension values. An empty value counts as missing.
type Dimensions interface {
	Dimension(name string) (value string, ok bool)
}

// Values is a map of dimension values; it implements [Dimensions].
type Values map[string]string

// Dimension returns v[name].
func (v Values) Dimension(name string) (string, bool) {
	s, ok := v[name]
	return s, ok
}

// Source says who made a rule's decision.
type Source uint8

// The decision sources.
const (
	// SourceLocal: a hybrid rule's local allowance, no I/O.
	SourceLocal Source = iota + 1
	// SourceCentral: a hybrid rule's synchronous Redis check.
	SourceCentral
	// SourceDenyCache: a hybrid rule's deny cache (banned, or denied by Redis until its retry-after).
	SourceDenyCache
	// SourceFallback: Redis could not answer; the rule's failure policy decided.
	SourceFallback
	// SourceStrict: a strict rule, in one atomic Redis call with the request's other strict rules.
	SourceStrict
	// SourceMemo: this Enforcer remembered the rule's denial of the subject until its retry-after;
	// nothing was asked and nothing consumed.
	SourceMemo
)

// String returns "local", "central", "deny-cache", "fallback", "strict" or "memo".
func (s Source) String() string {
	switch s {
	case SourceLocal:
		return "local"
	case SourceCentral:
		return "central"
	case SourceDenyCache:
		return "deny-cache"
	case SourceFallback:
		return "fallback"
	case SourceStrict:
		return "strict"
	case SourceMemo:
		return "memo"
	}
	return "none"
}

// Decision is one counter's answer for a request.
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
	// RetryAfter is how long until the request's cost would fit, when not Allowed.
	RetryAfter time.Duration
	// ResetAfter estimates how long until the quota is full again.
	ResetAfter time.Duration
	// Source says who decided.
	Source Source
	// Unavailable reports a denial made only because Redis could not answer and the rule fails
	// closed (on_failure: fail_closed): it says nothing about the subject's quota.
	Unavailable bool
}

// Result is the outcome of [Enforcer.Check]. The zero Result denies.
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

// ShadowEvent reports a would-be denial: a rule in shadow mode denied, or any rule denied while the
// whole policy is in shadow mode.
type ShadowEvent struct {
	// Rule and Unit name the counter; Decision is its answer.
	Rule, Unit string
	// Tier is the tier the request was counted under.
	Tier string
	// Key is the counter's key as stored in Redis (hashed when Config.HashKey is set), without the
	// prefix.
	Key string
	// Decision is the counter's answer.
	Decision Decision
	// Global reports that the rule is enforced but the policy is in shadow mode.
	Global bool
	// MissingKey reports that the rule would have rejected the request for a missing dimension.
	MissingKey bool
}

// Stats counts an Enforcer's decisions. Every field only grows. (Admitted requests are not counted
// here: a shared counter on every request would cost more than the decision itself.)
type Stats struct {
	Denied       atomic.Int64 // requests denied (MissingKey included)
	MissingKey   atomic.Int64 // requests rejected (or, in shadow mode, that would have been) for a missing key
	ShadowDenied atomic.Int64 // would-be denials reported (one per counter, or per request in shadow mode)
	Memo         atomic.Int64 // denials answered from the memo, with no counter consulted
	Fallback     atomic.Int64 // strict calls answered by failure policies because Redis could not answer
	Errors       atomic.Int64 // calls to Check that returned an error
	Reloads      atomic.Int64 // successful SetPolicy calls
}

// Enforcer applies a [Policy] to requests: hybrid rules through one hybrid.Limiter per failure policy
// in use, strict rules through one central.Strict, all on one Redis. Create it with [NewEnforcer],
// give it a policy with [Enforcer.SetPolicy] (or a [Reloader]), call [Enforcer.Check] per request and
// [Enforcer.Close] when done. It is safe for concurrent use; SetPolicy may be called at any time and
// takes effect for the next Check.
type Enforcer struct {
	cfg    Config
	now    func() time.Time
	strict *central.Strict
	cur    atomic.Pointer[compiled]
	closed atomic.Bool
	stats  Stats
	memo   *memo
	fb     *fallbacks
	macs   sync.Pool // of hash.Hash (HMAC-SHA-256 with cfg.HashKey)
	dims   map[string]bool

	mu       sync.Mutex         // guards limiters, gen, and the swap in SetPolicy
	limiters [3]*hybrid.Limiter // by failure policy, created on first need
	gen      uint64             // generation of the last policy set
}

// NewEnforcer validates cfg and returns an Enforcer without a policy. It does no I/O and starts no
// goroutine; hybrid limiters (and their background loops) start when a policy with hybrid rules is
// set.
func NewEnforcer(cfg Config) (*Enforcer, error) {
	if cfg.Redis == nil {
		return nil, errors.New("policy: Config.Redis is nil")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = hybrid.DefaultKeyPrefix
	}
	if cfg.StrictTimeout == 0 {
		cfg.StrictTimeout = DefaultStrictTimeout
	}
	if cfg.StrictTimeout < 0 {
		return nil, fmt.Errorf("policy: StrictTimeout %v: want a positive duration", cfg.StrictTimeout)
	}
	if cfg.FallbackNodes == 0 {
		cfg.FallbackNodes = 1
	}
	if cfg.FallbackNodes < 0 {
		return nil, fmt.Errorf("policy: FallbackNodes %d: want at least 1", cfg.FallbackNodes)
	}
	if cfg.MaxMemo == 0 {
		cfg.MaxMemo = DefaultMaxMemo
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.HashKey = append([]byte(nil), cfg.HashKey...)
	dims := map[string]bool{DimGlobal: true}
	for d := range builtinDims {
		dims[d] = true
	}
	for _, d := range cfg.Dimensions {
		if !validDimName(d) {
			return nil, fmt.Errorf("policy: dimension %q: want 1 to 32 bytes of [a-z0-9_], starting with a letter", d)
		}
		dims[d] = true
	}
	for name, f := range cfg.CostFuncs {
		if f == nil {
			return nil, fmt.Errorf("policy: cost function %q is nil", name)
		}
	}
	strict, err := central.NewStrict(central.StrictConfig{
		Client:  cfg.Redis,
		Prefix:  cfg.Prefix,
		Timeout: cfg.StrictTimeout,
		Breaker: central.BreakerConfig{Threshold: strictBreakerThreshold, Cooldown: strictBreakerCooldown},
		Now:     cfg.Now,
	})
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	e := &Enforcer{cfg: cfg, now: cfg.Now, strict: strict, dims: dims, fb: newFallbacks(maxFallback)}
	if cfg.MaxMemo > 0 {
		e.memo = newMemo(cfg.MaxMemo)
	}
	if len(cfg.HashKey) > 0 {
		e.macs.New = func() any { return &macState{h: hmac.New(sha256.New, e.cfg.HashKey)} }
	}
	return e, nil
}

// Stats returns the Enforcer's counters.
func (e *Enforcer) Stats() *Stats { return &e.stats }

// Limiters returns the hybrid limiters the Enforcer has created so far (one per failure policy in
// use), for their Stats. They belong to the Enforcer: do not close them.
func (e *Enforcer) Limiters() []*hybrid.Limiter {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*hybrid.Limiter
	for _, l := range e.limiters {
		if l != nil {
			out = append(out, l)
		}
	}
	return out
}

// StrictHealth is a snapshot of the strict rules' Redis client.
type StrictHealth struct {
	Calls    int64  // script calls sent
	Errors   int64  // calls that failed (network, timeout, error reply)
	Rejected int64  // calls not sent because the circuit breaker was open
	Breaker  string // the circuit breaker's state: "closed", "open" or "half-open"
}

// StrictHealth returns the state of the strict rules' Redis client.
func (e *Enforcer) StrictHealth() StrictHealth {
	st := e.strict.Stats()
	return StrictHealth{Calls: st.Calls.Load(), Errors: st.Errors.Load(), Rejected: st.Rejected.Load(),
		Breaker: e.strict.Breaker().State().String()}
}

// Policy returns the policy in force, or nil before the first SetPolicy.
func (e *Enforcer) Policy() *Policy {
	if c := e.cur.Load(); c != nil {
		return c.src
	}
	return nil
}

// SetPolicy validates p against the Enforcer's configuration and, if it is valid, puts it in force
// for the next Check. An invalid p returns an [*Error] (naming the line when p came from a file)
// and leaves the policy in force unchanged. Counters are kept in Redis by rule id, so a rule whose
// limit changes keeps its consumption.
func (e *Enforcer) SetPolicy(p *Policy) error {
	if p == nil {
		return &Error{Msg: "nil policy"}
	}
	norm, err := p.normalize(&checkEnv{dims: e.dims, costFuncs: e.cfg.CostFuncs})
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return ErrClosed
	}
	c, err := e.compileLocked(p, norm)
	if err != nil {
		return err
	}
	e.cur.Store(c)
	e.stats.Reloads.Add(1)
	return nil
}

// Close stops the hybrid limiters, flushing their pending consumption to Redis within ctx. Check
// returns ErrClosed afterwards. Close is safe to call more than once.
func (e *Enforcer) Close(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	for i, l := range e.limiters {
		if l != nil {
			if err := l.Close(ctx); err != nil {
				errs = append(errs, err)
			}
			e.limiters[i] = nil
		}
	}
	return errors.Join(errs...)
}

// compiled is a policy ready for Check.
type compiled struct {
	src         *Policy
	gen         uint64
	shadowAll   bool
	tagDim      string // Policy.StrictTag
	defaultTier string
	tiers       map[string]bool
	enforced    []*crule // hybrid ones first (most dimensions first, then file order), then strict ones
	nHybrid     int      // enforced[:nHybrid] are hybrid
	shadow      []*crule
	needRoute   bool // some rule matches on routes
}

// crule is a compiled rule.
type crule struct {
	id        string
	algo      Algorithm
	strict    bool
	shadow    bool
	dims      []string
	routes    map[string]bool // nil: any
	methods   []string        // upper case; nil: any
	tiers     map[string]bool // nil: any
	units     []unit
	byTier    map[string][]unit
	missing   MissingKey
	fixed     int64
	perMethod map[string]int64
	costFunc  CostFunc
	failure   hybrid.FailurePolicy
	lim       *hybrid.Limiter // hybrid rules
}

func (e *Enforcer) compileLocked(p *Policy, norm *normalized) (*compiled, error) {
	e.gen++
	c := &compiled{src: p, gen: e.gen, shadowAll: p.Shadow, tagDim: p.StrictTag, defaultTier: p.DefaultTier,
		tiers: make(map[string]bool, len(p.Tiers))}
	for name := range p.Tiers {
		c.tiers[name] = true
	}
	var hyb, str []*crule
	for _, nr := range norm.rules {
		r := nr.rule
		cr := &crule{
			id: r.ID, algo: nr.algo, strict: nr.algo != Hybrid, shadow: r.Shadow, dims: nr.dims,
			units: nr.units, byTier: nr.byTier, missing: nr.missing, fixed: max(r.Cost.Fixed, 1),
			costFunc: nr.cost, failure: r.OnFailure,
		}
		if len(r.Cost.PerMethod) > 0 {
			cr.perMethod = make(map[string]int64, len(r.Cost.PerMethod))
			for m, n := range r.Cost.PerMethod {
				cr.perMethod[m] = n
			}
		}
		if len(r.Match.Routes) > 0 {
			c.needRoute = true
			cr.routes = make(map[string]bool, len(r.Match.Routes))
			for _, rt := range r.Match.Routes {
				cr.routes[rt] = true
			}
		}
		for _, m := range r.Match.Methods {
			cr.methods = append(cr.methods, strings.ToUpper(m))
		}
		if len(r.Match.Tiers) > 0 {
			cr.tiers = make(map[string]bool, len(r.Match.Tiers))
			for _, t := range r.Match.Tiers {
				cr.tiers[t] = true
			}
		}
		if !cr.strict {
			l, err := e.limiterLocked(cr.failure)
			if err != nil {
				return nil, err
			}
			cr.lim = l
		}
		switch {
		case cr.shadow:
			c.shadow = append(c.shadow, cr)
		case cr.strict:
			str = append(str, cr)
		default:
			hyb = append(hyb, cr)
		}
	}
	// Narrowest hybrid rules first: a subject over its own limit is denied before it consumes from
	// broader, shared rules.
	sort.SliceStable(hyb, func(i, j int) bool { return len(hyb[i].dims) > len(hyb[j].dims) })
	c.enforced = append(hyb, str...)
	c.nHybrid = len(hyb)
	return c, nil
}

// limiterLocked returns the hybrid limiter of failure policy fp, creating it on first use.
func (e *Enforcer) limiterLocked(fp hybrid.FailurePolicy) (*hybrid.Limiter, error) {
	if l := e.limiters[fp]; l != nil {
		return l, nil
	}
	opts := append(append([]hybrid.Option(nil), e.cfg.HybridOptions...),
		hybrid.WithLogger(e.cfg.Logger), hybrid.WithKeyPrefix(e.cfg.Prefix), hybrid.WithFailurePolicy(fp))
	l, err := hybrid.New(e.cfg.Redis, opts...)
	if err != nil {
		return nil, fmt.Errorf("policy: hybrid limiter for %v: %w", fp, err)
	}
	e.limiters[fp] = l
	return l, nil
}

// planned is one counter to consult for a request.
type planned struct {
	r   *crule
	u   *unit
	key string // unit name + ":" + subject
	n   int64
}

// sub returns the subject part of the key (hashed when configured).
func (p *planned) sub() string { return p.key[len(p.u.name)+1:] }

// Check decides whether req may proceed under the policy in force, and counts it under every rule
// that admits it. A denial is not an error: err is non-nil only when no decision could be made —
// no policy yet (ErrNoPolicy), a closed Enforcer (ErrClosed), a cancelled ctx, a cost function's
// invalid answer (ErrInvalidCost), or a Redis failure that no failure policy covers (an error reply).
//
// docs/policies.md ("Hierarchy") states exactly what a denial leaves consumed.
func (e *Enforcer) Check(ctx context.Context, req *Request) (Result, error) {
	if e.closed.Load() {
		return Result{}, ErrClosed
	}
	c := e.cur.Load()
	if c == nil {
		return Result{}, ErrNoPolicy
	}
	if req == nil {
		req = &Request{}
	}
	res, err := e.check(ctx, c, req)
	if err != nil {
		e.stats.Errors.Add(1)
		return Result{}, err
	}
	if !res.Allowed {
		e.stats.Denied.Add(1)
	}
	return res, nil
}

func (e *Enforcer) check(ctx context.Context, c *compiled, req *Request) (Result, error) {
	tier := c.defaultTier
	if len(c.tiers) > 0 && c.tiers[req.Tier] {
		tier = req.Tier
	}
	var route string
	var routeOK bool
	if c.needRoute && req.Dims != nil {
		route, routeOK = req.Dims.Dimension(DimRoute)
	}
	var buf [8]planned
	plan := buf[:0]
	nEnforced, nStrict := 0, 0
	tag := ""
	missingShadow := false // shadow mode hid a missing-key rejection
	var sbuf [192]byte
	for pass := 0; pass < 2; pass++ {
		rules := c.enforced
		if pass == 1 {
			rules = c.shadow
			nEnforced = len(plan)
		}
		for _, r := range rules {
			if !r.matches(req.Method, route, routeOK, tier) {
				continue
			}
			units := r.units
			if r.byTier != nil {
				units = r.byTier[tier]
			}
			if len(units) == 0 {
				continue
			}
			subject, ok := e.subject(r, req, &sbuf)
			if !ok {
				if r.shadow || r.missing == MissingSkip {
					continue // shadow rules never deny, not even for a missing key
				}
				e.stats.MissingKey.Add(1)
				if c.shadowAll {
					missingShadow = true
					e.shadowEvent(ShadowEvent{Rule: r.id, Unit: units[0].name, Tier: tier, Global: true, MissingKey: true,
						Decision: Decision{Rule: r.id, Unit: units[0].name, Algorithm: r.algo}})
					continue
				}
				return Result{Rule: r.id, MissingKey: true}, nil
			}
			n, err := r.cost(req)
			if err != nil {
				return Result{}, err
			}
			if r.strict && tag == "" {
				tag = e.tag(c, req)
			}
			for i := range units {
				u := &units[i]
				if n > u.limit {
					return Result{}, fmt.Errorf("%w: rule %q: cost %d above its limit %d", ErrInvalidCost, r.id, n, u.limit)
				}
				key := u.name + ":" + string(subject) // one allocation: the subject is a slice of the key
				plan = append(plan, planned{r: r, u: u, key: key, n: n})
				if r.strict && !r.shadow {
					nStrict++
				}
			}
		}
	}
	res := Result{Allowed: true, ShadowDenied: missingShadow}
	if len(plan) == 0 {
		return res, nil
	}
	if cap(req.Decisions) >= len(plan) {
		res.Decisions = req.Decisions[:0]
	} else {
		res.Decisions = make([]Decision, 0, len(plan))
	}
	enforced := plan[:nEnforced]

	// A denial remembered until its retry-after denies without consulting (or consuming from) any rule.
	if e.memo != nil && !e.memo.empty() {
		now := e.now()
		for i := range enforced {
			p := &enforced[i]
			if wait, ok := e.memo.denied(p.key, c.gen, p.n, now); ok {
				e.stats.Memo.Add(1)
				d := p.decision(false, SourceMemo)
				d.RetryAfter = wait
				d.ResetAfter = wait
				res.Decisions = append(res.Decisions, d)
				res.Allowed, res.Rule, res.RetryAfter = false, p.r.id, wait
				return e.shadowAll(ctx, c, tier, tag, res, plan), nil
			}
		}
	}

	// Hybrid rules, narrowest first; the first denial stops the evaluation.
	for i := range enforced {
		p := &enforced[i]
		if p.r.strict {
			continue
		}
		hd, err := p.r.lim.AllowN(ctx, p.key, p.u.hybrid, p.n)
		if err != nil {
			return Result{}, fmt.Errorf("policy: rule %q: %w", p.r.id, err)
		}
		d := hybridDecision(p, hd)
		res.Decisions = append(res.Decisions, d)
		if !hd.Allowed {
			if !d.Unavailable { // a fail-closed denial says nothing about the subject: not remembered
				e.remember(p, c.gen, d.RetryAfter)
			}
			res.Allowed, res.Rule, res.RetryAfter, res.Unavailable = false, p.r.id, d.RetryAfter, d.Unavailable
			return e.shadowAll(ctx, c, tier, tag, res, plan), nil
		}
	}

	// Strict rules, all in one atomic call.
	if nStrict > 0 {
		if err := e.checkStrict(ctx, c, tag, enforced, &res); err != nil {
			return Result{}, err
		}
		if !res.Allowed {
			return e.shadowAll(ctx, c, tier, tag, res, plan), nil
		}
	}
	e.evalShadow(ctx, tier, tag, plan[nEnforced:], &res)
	return res, nil
}

// shadowAll finishes a denied result: in shadow mode it reports the denial, admits the request and
// evaluates the shadow rules (plan holds every counter of the request; its shadow ones are last);
// otherwise it returns res as is.
func (e *Enforcer) shadowAll(ctx context.Context, c *compiled, tier, tag string, res Result, plan []planned) Result {
	if !c.shadowAll {
		return res
	}
	for _, d := range res.Decisions {
		if d.Allowed {
			continue
		}
		key := ""
		for i := range plan {
			if plan[i].u.name == d.Unit {
				key = plan[i].key
				break
			}
		}
		e.shadowEvent(ShadowEvent{Rule: d.Rule, Unit: d.Unit, Tier: tier, Key: key, Decision: d, Global: true})
	}
	res.Allowed, res.ShadowDenied = true, true
	first := len(plan)
	for i := range plan {
		if plan[i].r.shadow {
			first = i
			break
		}
	}
	e.evalShadow(ctx, tier, tag, plan[first:], &res)
	return res
}

// evalShadow consults each shadow rule on its own, reporting its denials. Errors are counted, never
// returned: a shadow rule cannot affect the request. Strict shadow rules use the request's tag, so
// their counters are the ones the rule would use if enforced.
func (e *Enforcer) evalShadow(ctx context.Context, tier, tag string, shadow []planned, res *Result) {
	for i := range shadow {
		p := &shadow[i]
		var d Decision
		if p.r.strict {
			m, err := e.strict.AllowMulti(ctx, tag, []central.Check{{Rule: p.u.strict, Subject: p.sub(), N: p.n}})
			if err != nil {
				e.stats.Errors.Add(1)
				continue
			}
			d = strictDecision(p, m.Results[0], m.Allowed)
		} else {
			hd, err := p.r.lim.AllowN(ctx, p.key, p.u.hybrid, p.n)
			if err != nil {
				e.stats.Errors.Add(1)
				continue
			}
			d = hybridDecision(p, hd)
		}
		d.Shadow = true
		res.Decisions = append(res.Decisions, d)
		if !d.Allowed {
			e.shadowEvent(ShadowEvent{Rule: d.Rule, Unit: d.Unit, Tier: tier, Key: p.key, Decision: d})
		}
	}
}

func (e *Enforcer) shadowEvent(ev ShadowEvent) {
	e.stats.ShadowDenied.Add(1)
	if e.cfg.OnShadowDeny != nil {
		e.cfg.OnShadowDeny(ev)
	}
}

// checkStrict runs the enforced strict counters of the plan in one AllowMulti call and records the
// outcome in res.
func (e *Enforcer) checkStrict(ctx context.Context, c *compiled, tag string, enforced []planned, res *Result) error {
	var ps [central.MaxStrictChecks]*planned
	var checks [central.MaxStrictChecks]central.Check
	k := 0
	for i := range enforced {
		if p := &enforced[i]; p.r.strict {
			ps[k] = p
			checks[k] = central.Check{Rule: p.u.strict, Subject: p.sub(), N: p.n}
			k++
		}
	}
	m, err := e.strict.AllowMulti(ctx, tag, checks[:k])
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return ctx.Err()
		}
		if !central.IsTransport(err) {
			return fmt.Errorf("policy: strict rules: %w", err)
		}
		e.stats.Fallback.Add(1)
		e.strictFallback(ps[:k], res)
		return nil
	}
	var worst *Decision
	for i := 0; i < k; i++ {
		d := strictDecision(ps[i], m.Results[i], m.Allowed)
		res.Decisions = append(res.Decisions, d)
		if !d.Allowed {
			e.remember(ps[i], c.gen, d.RetryAfter)
		}
	}
	if !m.Allowed {
		for i := len(res.Decisions) - k; i < len(res.Decisions); i++ {
			if d := &res.Decisions[i]; !d.Allowed && (worst == nil || d.RetryAfter > worst.RetryAfter) {
				worst = d
			}
		}
		res.Allowed, res.Rule, res.RetryAfter = false, worst.Rule, worst.RetryAfter
	}
	return nil
}

// strictFallback answers the strict counters by their failure policies, all or nothing: local
// reservations are cancelled unless every counter admits.
func (e *Enforcer) strictFallback(ps []*planned, res *Result) {
	now := e.now()
	var cancels [central.MaxStrictChecks]func()
	allowed := true
	start := len(res.Decisions)
	for i, p := range ps {
		d := p.decision(false, SourceFallback)
		switch p.r.failure {
		case hybrid.FailOpen:
			d.Allowed = true
		case hybrid.FailClosed:
			d.RetryAfter = strictBreakerCooldown
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
	var worst *Decision
	for i := start; i < len(res.Decisions); i++ {
		if d := &res.Decisions[i]; !d.Allowed && (worst == nil || d.RetryAfter > worst.RetryAfter) {
			worst = d
		}
	}
	res.Allowed, res.Rule, res.RetryAfter, res.Unavailable = false, worst.Rule, worst.RetryAfter, worst.Unavailable
}

// remember records a denial in the memo until its retry-after.
func (e *Enforcer) remember(p *planned, gen uint64, wait time.Duration) {
	if e.memo == nil || wait <= 0 {
		return
	}
	e.memo.add(p.key, gen, p.n, e.now().Add(wait))
}

func (p *planned) decision(allowed bool, src Source) Decision {
	return Decision{Rule: p.r.id, Unit: p.u.name, Algorithm: p.r.algo, Allowed: allowed, Limit: p.u.limit,
		Window: p.u.window, Source: src}
}

func hybridDecision(p *planned, hd hybrid.Decision) Decision {
	d := p.decision(hd.Allowed, SourceFallback)
	switch hd.Source {
	case hybrid.SourceLocal:
		d.Source = SourceLocal
	case hybrid.SourceCentral:
		d.Source = SourceCentral
	case hybrid.SourceDenyCache:
		d.Source = SourceDenyCache
	}
	d.Remaining, d.RetryAfter, d.ResetAfter = max(hd.Remaining, 0), max(hd.RetryAfter, 0), max(hd.ResetAfter, hd.RetryAfter, 0)
	d.Unavailable = hd.Source == hybrid.SourceFallback && !hd.Allowed && p.r.failure == hybrid.FailClosed
	return d
}

func strictDecision(p *planned, r central.Result, all bool) Decision {
	d := p.decision(r.Allowed, SourceStrict)
	d.Remaining, d.RetryAfter, d.ResetAfter = r.Remaining, r.RetryAfter, max(r.ResetAfter, r.RetryAfter)
	if !all && r.Allowed {
		// This counter had room, but another denied: nothing was counted.
		d.RetryAfter = 0
	}
	return d
}

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

// subject returns the request's subject under r, in buf when it fits: "dim=value,..." in the rule's
// canonical dimension order, values percent-escaped, hashed with Config.HashKey when set. ok is false
// when a dimension is missing and the rule does not count missing keys in a shared bucket.
func (e *Enforcer) subject(r *crule, req *Request, buf *[192]byte) ([]byte, bool) {
	b := buf[:0]
	if len(r.dims) == 0 {
		b = append(b, anonymous...)
	}
	for i, dim := range r.dims {
		v, ok := "", false
		if req.Dims != nil {
			v, ok = req.Dims.Dimension(dim)
		}
		if dim == DimMethod && !ok {
			v, ok = req.Method, req.Method != ""
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, dim...)
		b = append(b, '=')
		if !ok || v == "" || len(v) > MaxValueLen {
			if r.missing != MissingShared {
				return nil, false
			}
			b = append(b, anonymous...)
			continue
		}
		b = appendEscaped(b, v)
	}
	return e.finish(b, buf), true
}

// tag returns the hash tag of the request's strict keys.
func (e *Enforcer) tag(c *compiled, req *Request) string {
	if c.tagDim == "" {
		return strictTag
	}
	v, ok := "", false
	if req.Dims != nil {
		v, ok = req.Dims.Dimension(c.tagDim)
	}
	if !ok || v == "" || len(v) > MaxValueLen {
		return anonymous
	}
	var buf [192]byte
	return string(e.finish(appendEscaped(buf[:0], v), &buf))
}

// macState is a pooled HMAC with a buffer for its input, so that callers' buffers do not escape.
type macState struct {
	h   hash.Hash
	buf []byte
	sum [sha256.Size]byte
}

// finish hashes a subject when configured (or when it is too long to store), writing the result in
// out, and returns it; otherwise it returns b.
func (e *Enforcer) finish(b []byte, out *[192]byte) []byte {
	switch {
	case len(e.cfg.HashKey) > 0:
		st := e.macs.Get().(*macState)
		st.buf = append(st.buf[:0], b...)
		st.h.Reset()
		st.h.Write(st.buf)
		st.h.Sum(st.sum[:0])
		b = hex.AppendEncode(out[:0], st.sum[:16])
		e.macs.Put(st)
		return b
	case len(b) > maxSubject:
		sum := sha256.Sum256(b)
		return hex.AppendEncode(append(out[:0], "sha256-"...), sum[:16])
	}
	return b
}

// appendEscaped appends v with every byte outside [A-Za-z0-9._~/:@+-] and space percent-escaped,
// so values cannot contain the separators ',' and '=', the hash-tag braces, or '*'.
func appendEscaped(b []byte, v string) []byte {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '~' || c == '/' || c == ':' || c == '@' || c == '+' || c == '-' || c == ' ' {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
	}
	return b
}
