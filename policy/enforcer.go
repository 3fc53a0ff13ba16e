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
	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/strict"
)

// Errors of the Enforcer.
var (
	// ErrClosed is returned by Check and SetPolicy after Close.
	ErrClosed = errors.New("policy: enforcer closed")
	// ErrNoPolicy is returned by Check before the first successful SetPolicy.
	ErrNoPolicy = errors.New("policy: no policy set")
)

// Defaults of the Enforcer's options.
const (
	// DefaultStrictTimeout is the default of [WithStrictTimeout].
	DefaultStrictTimeout = 50 * time.Millisecond
	// DefaultMaxMemo is the default of [WithMaxMemo].
	DefaultMaxMemo = 1 << 16
)

// config is an Enforcer's settings: Redis from NewEnforcer, the rest from its options
// (options.go); the zero values stand for the defaults NewEnforcer fills in.
type config struct {
	Redis           redis.UniversalClient
	KeyPrefix       string              // WithKeyPrefix
	HybridOptions   []hybrid.Option     // WithHybridOptions
	StrictTimeout   time.Duration       // WithStrictTimeout
	WindowLeases    bool                // WithWindowLeases
	WindowLeaseLife time.Duration       // WithWindowLeases
	HashKey         []byte              // WithHashKey
	Dimensions      []string            // WithDimensions
	CostFuncs       map[string]CostFunc // WithCostFunc
	OnShadowDeny    func(ShadowEvent)   // WithOnShadowDeny
	FallbackNodes   int                 // WithFallbackNodes
	MaxMemo         int                 // WithMaxMemo
	Now             func() time.Time    // WithClock
	Logger          *slog.Logger        // WithLogger
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
	cfg        config
	now        func() time.Time
	strict     *strict.Limiter
	cur        atomic.Pointer[compiled]
	closed     atomic.Bool
	stats      counters
	longLogged atomic.Bool // a long value has been logged (once per Enforcer)
	memo       *memo       // denials until their retry-after; nil when WithMaxMemo was negative
	fb         *fallbacks  // strict rules' local fallbacks (hybrid rules use the hybrid limiter's)
	macs       sync.Pool   // of hash.Hash (HMAC-SHA-256 with cfg.HashKey)
	keyBufs    sync.Pool   // of *keyBuf: the storage of a request's borrowed counter keys (see keyBuf)
	dims       map[string]bool

	mu  sync.Mutex      // guards lim, gen, and the swap in SetPolicy
	lim *hybrid.Limiter // the hybrid rules' limiter, created on first need
	gen uint64          // generation of the last policy set
}

// NewEnforcer returns an Enforcer without a policy, holding its counters in rdb: a *redis.Client,
// a Sentinel failover client or a *redis.ClusterClient. Strict rules are not idempotent under
// go-redis's retries (a re-sent script may count twice, never admit twice); MaxRetries: -1 keeps
// each charge single (see strict.Limiter). Every other setting is an [Option]. NewEnforcer does no
// I/O and starts no goroutine; the hybrid limiter (and its background loop) starts when a policy
// with hybrid rules is first set. Errors: a nil rdb or an invalid option (wrapping [ErrBadOption]),
// or strict.New's error.
func NewEnforcer(rdb redis.UniversalClient, opts ...Option) (*Enforcer, error) {
	if rdb == nil {
		return nil, badOption("nil Redis client")
	}
	cfg := config{Redis: rdb}
	if err := option.Apply(&cfg, ErrBadOption, opts); err != nil {
		return nil, err
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = hybrid.DefaultKeyPrefix
	}
	if cfg.StrictTimeout == 0 {
		cfg.StrictTimeout = DefaultStrictTimeout
	}
	if cfg.FallbackNodes == 0 {
		cfg.FallbackNodes = 1
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
		dims[d] = true
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
// strict.WithTimeout; the Redis client is never closed). Check returns ErrClosed afterwards. Close is
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
	kb := e.getKeyBuf()
	pl, counters, err := e.makePlan(c, req, buf[:0], kb)
	if err != nil {
		return Result{}, err
	}
	if pl.missing != "" {
		return Result{Rule: pl.missing, MissingKey: true}, nil
	}
	// The Result the steps after the plan fill in: admitted until a counter denies, with room for a
	// Decision per counter. Set field by field: a Result returned by a helper was copied with wide
	// loads of what narrow stores had just written (a store-forwarding stall: ~30 ns a request in a
	// CPU profile of the middleware's benchmark).
	var res Result
	res.Allowed, res.ShadowDenied = true, pl.missingShadow
	if len(counters) > 0 {
		res.Decisions = decisions(req, len(counters))
	}
	if len(counters) == 0 {
		e.keyBufs.Put(kb)
		return res, nil
	}
	if req.CheckOnly || pl.nStrict > 0 || pl.nEnforced < len(counters) {
		// Only a request whose counters are all enforced hybrid ones decides with borrowed keys.
		ownKeys(counters)
		e.keyBufs.Put(kb)
		kb = nil
	}
	enforced := counters[:pl.nEnforced]
	e.checkMemo(c, enforced, &res)
	if !res.Allowed {
		ownKeys(counters)
	}
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
		ownKeys(counters) // checkHybrid owned them before any call that may keep a key; this is cheap
		return e.denied(ctx, c, pl, counters, res), nil
	}
	e.evalShadow(ctx, pl, counters[pl.nEnforced:], &res)
	if kb != nil {
		// Every borrowed key went only to calls that do not keep it (DecideLocalN, the memo's lookups).
		e.keyBufs.Put(kb)
	}
	return res, nil
}
