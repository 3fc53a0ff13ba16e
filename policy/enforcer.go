package policy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/strict"
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
	// DefaultStrictTimeout is Config.StrictTimeout's default.
	DefaultStrictTimeout = 50 * time.Millisecond
	// DefaultMaxMemo is Config.MaxMemo's default.
	DefaultMaxMemo = 1 << 16
)

// Config configures an [Enforcer]. Redis is required; every other field has a default. The zero
// Config is invalid (NewEnforcer needs Redis). It is a plain value; NewEnforcer copies it (HashKey
// too), so it may be changed or reused afterwards.
type Config struct {
	// Redis holds the counters: a *redis.Client, a Sentinel failover client or a *redis.ClusterClient.
	// Strict rules are not idempotent under go-redis's retries (a re-sent script may count twice,
	// never admit twice); MaxRetries: -1 keeps each charge single (see strict.Limiter).
	Redis redis.UniversalClient
	// KeyPrefix starts every Redis key (hybrid and strict rules): what hybrid.WithKeyPrefix and
	// strict.WithKeyPrefix accept. The default is hybrid.DefaultKeyPrefix.
	KeyPrefix string
	// HybridOptions are passed to hybrid.New for the hybrid rules' limiter (one per Enforcer, created
	// when a policy first needs it), before the Enforcer's own WithLogger and WithKeyPrefix. Each rule
	// carries its failure policy in its limits (hybrid.Limit.OnFailure), so hybrid.WithFailurePolicy
	// here has no effect on rules. On miniredis, pass hybrid.WithCheckTimeout(time.Second): its Lua is
	// slow.
	HybridOptions []hybrid.Option
	// StrictTimeout bounds one strict Redis call; the default is 50ms. A call that times out is
	// answered by each rule's failure policy.
	StrictTimeout time.Duration
	// WindowLeases counts UpstreamWindow rules as envoyproxy/ratelimit counts them, in a string key per
	// window charged with INCRBY, instead of strict.lua, and with WindowLeaseLife > 0 serves them
	// local-first from leases of the window's quota (strict.WithWindowLeases, docs/sidecar.md,
	// "Local-first windows"). Windows are then decided by Now, as upstream decides them. A request
	// that checks UpstreamWindow rules together with rules of other strict algorithms is then an
	// error: a policy whose requests each select one rule (Policy.Select, as NewUpstreamConfig
	// compiles) never makes one. Off by default.
	WindowLeases bool
	// WindowLeaseLife is how long a lease should last at the key's demand (the lease is the demand
	// times this, at most 1/strict.WindowLeaseShare of the window's remaining quota); 0 with
	// WindowLeases: no lease, one INCRBY per check. Not negative.
	WindowLeaseLife time.Duration
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
	// under outcome.LocalFallback each process enforces Limit/FallbackNodes locally. The default is 1. (Hybrid
	// rules use the node count the limiter last saw.)
	FallbackNodes int
	// MaxMemo bounds the denials remembered until their retry-after (see docs/policies.md,
	// "Hierarchy"); the default is 65536. Negative disables the memo.
	MaxMemo int
	// Now is the clock of the memo, of local fallbacks and of the windows of WindowLeases; nil means
	// time.Now. The other limits run on Redis TIME.
	Now func() time.Time
	// Logger receives background errors of the hybrid limiters; nil discards them.
	Logger *slog.Logger
}

// Stats is a snapshot of an Enforcer's counts, from [Enforcer.Stats]. Every count only grows over the
// Enforcer's life. (Admitted requests are not counted: a shared counter on every request would cost
// more than the decision itself.) The zero Stats counts nothing; it is a plain value, safe to copy.
type Stats struct {
	Denied       int64 // requests denied (MissingKey included)
	MissingKey   int64 // requests rejected (or, in shadow mode, that would have been) for a missing key
	ShadowDenied int64 // would-be denials reported (one per counter, or per request in shadow mode)
	Memo         int64 // denials answered from the memo, with no counter consulted
	Fallback     int64 // strict calls answered by failure policies because Redis could not answer
	Errors       int64 // calls to Check that returned an error
	Reloads      int64 // successful SetPolicy calls
	LongValues   int64 // dimension values longer than MaxValueLen, counted under their SHA-256
	Unrefunded   int64 // units hybrid rules took for denied requests and could not give back
}

// counters are the live counts behind [Stats].
type counters struct {
	Denied, MissingKey, ShadowDenied, Memo, Fallback, Errors, Reloads, LongValues, Unrefunded atomic.Int64
}

// Enforcer applies a [Policy] to requests: hybrid rules through one hybrid.Limiter (each rule's
// failure policy travels in its limits), strict rules through one strict.Limiter, all on one Redis. Create it with [NewEnforcer],
// give it a policy with [Enforcer.SetPolicy] (or a [Reloader]), call [Enforcer.Check] per request and
// [Enforcer.Close] when done. It is safe for concurrent use; SetPolicy may be called at any time and
// takes effect for the next Check.
type Enforcer struct {
	cfg        Config
	now        func() time.Time
	strict     *strict.Limiter
	cur        atomic.Pointer[compiled]
	closed     atomic.Bool
	stats      counters
	longLogged atomic.Bool // a long value has been logged (once per Enforcer)
	memo       *memo       // denials until their retry-after; nil when Config.MaxMemo < 0
	fb         *fallbacks  // strict rules' local fallbacks (hybrid rules use the hybrid limiter's)
	macs       sync.Pool   // of hash.Hash (HMAC-SHA-256 with cfg.HashKey)
	dims       map[string]bool

	mu  sync.Mutex      // guards lim, gen, and the swap in SetPolicy
	lim *hybrid.Limiter // the hybrid rules' limiter, created on first need
	gen uint64          // generation of the last policy set
}

// NewEnforcer validates cfg and returns an Enforcer without a policy. It does no I/O and starts no
// goroutine; the hybrid limiter (and its background loop) starts when a policy with hybrid rules is
// first set. Errors: a nil Redis, a negative StrictTimeout or FallbackNodes below 1, an invalid
// dimension name, a nil cost function, or strict.New's error.
func NewEnforcer(cfg Config) (*Enforcer, error) {
	if cfg.Redis == nil {
		return nil, errors.New("policy: Config.Redis is nil")
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = hybrid.DefaultKeyPrefix
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
	strict, err := newStrictClient(&cfg)
	if err != nil {
		return nil, err
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

// Stats returns a snapshot of the Enforcer's counters (each read atomically, not all at one instant).
// It does no I/O.
func (e *Enforcer) Stats() Stats {
	c := &e.stats
	return Stats{Denied: c.Denied.Load(), MissingKey: c.MissingKey.Load(), ShadowDenied: c.ShadowDenied.Load(),
		Memo: c.Memo.Load(), Fallback: c.Fallback.Load(), Errors: c.Errors.Load(), Reloads: c.Reloads.Load(),
		LongValues: c.LongValues.Load(), Unrefunded: c.Unrefunded.Load()}
}

// Policy returns the policy in force, or nil before the first SetPolicy. It does no I/O; the Policy
// is shared, not to be modified.
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

// Close stops the hybrid limiter, flushing its pending consumption to Redis within ctx, and closes
// the strict rules' limiter (which releases the cluster client it may have built for itself: see
// strict.WithTimeout; Config.Redis is never closed). Check returns ErrClosed afterwards. Close is
// safe to call more than once.
func (e *Enforcer) Close(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	var err error
	if e.lim != nil {
		err = e.lim.Close(ctx)
		e.lim = nil
	}
	e.closeStrict()
	return err
}

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

// readable reports whether every strict counter of enforced can be read without counting (see
// Algorithm.countsRefused): only then does a check-only request consult Redis for them.
func readable(enforced []planned) bool {
	for i := range enforced {
		if p := &enforced[i]; p.r.strict && !p.r.algo.countsRefused() {
			return false
		}
	}
	return true
}

// check is the request path: plan → memo → hybrid → strict → shadow. Each step after the plan runs
// only while no counter has denied; a denial goes to denied, which applies the policy's shadow mode.
func (e *Enforcer) check(ctx context.Context, c *compiled, req *Request) (Result, error) {
	if c.domain != "" && req.Domain != "" && req.Domain != c.domain {
		if c.unknown == DomainAllow {
			return Result{Allowed: true}, nil
		}
		return Result{}, fmt.Errorf("%w: %q (the policy serves %q)", ErrUnknownDomain, req.Domain, c.domain)
	}
	var buf [8]planned
	pl, counters, err := e.makePlan(c, req, buf[:0])
	if err != nil {
		return Result{}, err
	}
	if pl.missing != "" {
		return Result{Rule: pl.missing, MissingKey: true}, nil
	}
	res := pl.result(req, len(counters))
	if len(counters) == 0 {
		return res, nil
	}
	enforced := counters[:pl.nEnforced]
	e.checkMemo(c, enforced, &res)
	if req.CheckOnly {
		if res.Allowed {
			if err := e.peekHybrid(ctx, enforced, &res); err != nil {
				return Result{}, err
			}
		}
		if res.Allowed && pl.nStrict > 0 && readable(enforced) {
			// Every strict counter counts refused hits: its script reads the count at a cost of 0.
			if err := e.checkStrict(ctx, c, pl.tag, enforced, &res); err != nil {
				return Result{}, err
			}
		}
		if !res.Allowed && c.shadowAll {
			res.Allowed, res.ShadowDenied = true, true
		}
		return res, nil
	}
	if res.Allowed {
		if err := e.checkHybrid(ctx, c, enforced, &res); err != nil {
			return Result{}, err
		}
	}
	if res.Allowed && pl.nStrict > 0 {
		if err := e.checkStrict(ctx, c, pl.tag, enforced, &res); err != nil {
			e.refundHybrid(ctx, enforced) // no decision: the request is not admitted either
			return Result{}, err
		}
		if !res.Allowed && !c.shadowAll {
			// A strict rule denied after every hybrid rule admitted: give their charges back.
			e.refundHybrid(ctx, enforced)
		}
	}
	if !res.Allowed {
		return e.denied(ctx, c, pl, counters, res), nil
	}
	e.evalShadow(ctx, pl, counters[pl.nEnforced:], &res)
	return res, nil
}
