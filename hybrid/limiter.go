package hybrid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/denycache"
	"github.com/hybridrate/hybridrate/internal/every"
	"github.com/hybridrate/hybridrate/internal/limits"
	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/local"
	"github.com/hybridrate/hybridrate/outcome"
	ratesync "github.com/hybridrate/hybridrate/sync"
)

// Errors returned by the limiter. Input errors wrap one of these with details.
var (
	ErrClosed       = errors.New("hybrid: limiter closed")
	ErrNilClient    = errors.New("hybrid: nil redis client")
	ErrInvalidKey   = errors.New("hybrid: invalid key")
	ErrInvalidLimit = errors.New("hybrid: invalid limit")
	ErrInvalidCost  = errors.New("hybrid: invalid cost")
)

// Decision is the outcome of [Limiter.DecideN] ([Limiter.AllowN] returns only its Allowed). The
// zero Decision denies. It is a plain value, safe to copy and share.
type Decision struct {
	// Allowed reports whether the n tokens were granted.
	Allowed bool
	// Unavailable reports a denial made only because Redis could not answer and the failure policy
	// is outcome.FailClosed (Source is then outcome.SourceFallback): it says nothing about the key's tokens.
	Unavailable bool
	// Source says who decided.
	Source outcome.Source
	// Limit is the limit the decision was made under.
	Limit Limit
	// Remaining estimates the global tokens left after this decision: exact when Source is
	// outcome.SourceCentral, otherwise the last global count this node saw less what it consumed since.
	Remaining int64
	// RetryAfter is how long to wait before the same request could be allowed; zero when Allowed.
	RetryAfter time.Duration
	// ResetAfter estimates how long until the bucket is full again.
	ResetAfter time.Duration
}

// Limiter is a distributed token-bucket rate limiter: decisions are made locally in nanoseconds from
// an allowance that a background loop reconciles with Redis, and go to Redis synchronously only near
// the limit. Create one with [New] per process (it can serve any number of keys and limits) and call
// [Limiter.Close] when done. A Limiter is safe for concurrent use. Most callers want
// [Limiter.Allow], or [Limiter.Decide] for the tokens left and the time to retry (rate-limit
// headers); [Limiter.Wait] blocks until admitted, [Limiter.Reserve] and [Limiter.Refund] give
// unused tokens back, [Limiter.Peek] and [Limiter.Reset] inspect and reset a key (docs/api.md says
// how accurate each is in a fleet).
type Limiter struct {
	opts     options
	central  *central.Client
	store    *local.Store
	syncer   *ratesync.Syncer
	deny     *denycache.Cache
	tracer   trace.Tracer
	closed   atomic.Bool
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	fallback *lru.Cache[string, *fallbackBucket] // outcome.LocalFallback buckets, per key
	nodeID   string
	counts   [numStripes]stripe // decisions off the fast path (its own are counted in the entries: Stats), striped
	metrics  *metrics
	started  time.Time    // origin of mono
	fleet    atomic.Int64 // the most nodes Redis has reported active on any key: the fleet size estimate
	// fleetSize is the live limiters under this key prefix at the last heartbeat (the fleet
	// registry, fleet.go); 0 until Redis first answers.
	fleetSize atomic.Int64
	fleetGrew atomic.Bool // the last heartbeat found the fleet much larger (beatEvery)
	fleetW    fleetWatch
	evict     evictionWatch
	bans      banWatch
}

// New returns a limiter that keeps its global state in rdb (a *redis.Client, a Sentinel failover
// client or a *redis.ClusterClient) and starts its background loop. It does no Redis I/O: a Redis
// that is down at start behaves like one that goes down later. A client created without
// ContextTimeoutEnabled, whose calls go-redis would not end at their deadline, is used through copies
// with the limiter's own socket timeouts or, for a cluster client, through a cluster client of the
// limiter's own built from its options with ContextTimeoutEnabled, which Close closes; neither runs
// the client's hooks (docs/operations.md, "Cluster clients and timeouts"). rdb is never closed.
// Errors: [ErrNilClient] for a nil rdb; [ErrBadOption] (wrapped) for an invalid or nil option.
func New(rdb redis.UniversalClient, opts ...Option) (*Limiter, error) {
	if rdb == nil || isNilClient(rdb) {
		return nil, ErrNilClient
	}
	o := defaultOptions()
	if err := option.Apply(&o, ErrBadOption, opts); err != nil {
		return nil, err
	}
	if o.nodeID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.nodeID = hex.EncodeToString(b[:])
	}
	logs := newBGLog(o.logger, logSummaryEvery)
	var self *Limiter // set below, before anything can call Fleet
	cc, err := central.New(central.Config{
		Client:         rdb,
		Prefix:         o.prefix,
		NodeID:         o.nodeID,
		SyncTimeout:    o.checkTimeout,
		FlushTimeout:   o.flushTimeout,
		MaxBatch:       scriptBatch,
		PruneAge:       pruneAge,
		Recount:        recountPeriod,
		ActiveWindow:   2 * LeaseLife,
		Horizon:        LeaseHorizon,
		Advance:        o.leaseAdvance,
		Breaker:        breakerConfig(logs.breaker),
		OnCheckBreaker: logs.checkBreaker,
		Now:            nil, // the breaker measures its cooldown on the monotonic clock, never WithClock's
		ScriptNow:      o.scriptNow,
		Fleet:          func() int64 { return self.fleetSize.Load() },
	})
	if err != nil {
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	deny, err := denycache.New(denycache.Config{MaxBans: o.maxBans, MaxDenied: maxDenied})
	if err != nil {
		_ = cc.Close()
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	// A key the deny cache holds has its entry held (see hold), from its insert on.
	held := func(key string) bool {
		if deny.Empty() {
			return false
		}
		reason, _ := deny.Check(key, o.now())
		return reason != denycache.None
	}
	store, err := local.New(local.Config{MaxKeys: o.maxKeys, Held: held})
	if err != nil {
		_ = cc.Close()
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	fb, err := lru.New[string, *fallbackBucket](maxFallback)
	if err != nil {
		_ = cc.Close()
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	l := &Limiter{
		opts:     o,
		central:  cc,
		store:    store,
		deny:     deny,
		fallback: fb,
		nodeID:   o.nodeID,
		tracer:   o.tracerProvider.Tracer(instrumentationName),
		started:  time.Now(),
	}
	self = l
	l.bans.init()
	var port interface {
		Reconcile(ctx context.Context, updates []central.Update, out []central.State, errs []error) error
	} = cc
	if o.upstream != nil {
		port = upstreamPort{o.upstream, o.nodeID, o.flushTimeout}
	}
	l.syncer, err = ratesync.New(ratesync.Config{
		Store:     store,
		Central:   port,
		Interval:  o.syncInterval,
		MaxBatch:  flushBatch,
		Drift:     o.drift,
		Horizon:   LeaseHorizon,
		Advance:   o.leaseAdvance,
		Fleet:     func() int64 { return self.fleetSize.Load() },
		LeaseLife: LeaseLife,
		Now:       l.mono,
		OnState: func(e *local.Entry, st central.State) {
			if st.Status == central.StatusBanned {
				l.ban(e.Key(), l.opts.now().Add(max(st.RetryAfter, time.Millisecond)))
			} else if l.bansIncomplete() {
				l.bans.add(e.Key()) // it may be banned beyond the local copy: check it
			}
			_, active := e.Global()
			for {
				f := l.fleet.Load()
				if active <= f || l.fleet.CompareAndSwap(f, active) {
					break
				}
			}
		},
		OnError: func(err error) { logs.failed(&logs.reconcile, err) },
	})
	if err != nil {
		_ = cc.Close()
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	if cc.HooksBypassed() {
		o.logger.Info("hybridrate: the limiter's Redis calls bypass hooks added to this client (it uses copies, or for a cluster client a client of its own, with its own timeouts); " +
			"create the client with ContextTimeoutEnabled: true to keep hooks such as tracing")
	}
	if !cc.TimeoutsEnforced() {
		o.logger.Warn("hybridrate: this Redis client type is neither a *redis.Client nor a *redis.ClusterClient; " +
			"a hung Redis may hold calls beyond WithCheckTimeout and WithFlushTimeout unless it applies context deadlines")
	}
	if l.metrics, err = newMetrics(l); err != nil {
		_ = cc.Close()
		return nil, fmt.Errorf("hybrid: metrics: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	if o.manual {
		// The fleet simulator steps it (internal/virtual), with no ban list to watch: the (empty)
		// list is complete, and cold-start credit is granted as in production once it is read.
		l.bans.known.Store(true)
		return l, nil
	}
	l.wg.Add(6)
	go func() {
		defer l.wg.Done()
		l.syncer.Run(ctx)
	}()
	go func() {
		defer l.wg.Done()
		l.sweepIdle(ctx)
	}()
	go func() {
		defer l.wg.Done()
		l.watchFleet(ctx)
	}()
	go func() {
		defer l.wg.Done()
		l.watchEviction(ctx)
	}()
	go func() {
		defer l.wg.Done()
		l.checkBans(ctx, func(err error) { logs.failed(&logs.bans, err) })
	}()
	go func() {
		defer l.wg.Done()
		// Load the scripts and open a connection off the request path, so that the first decisions
		// do not spend their short check timeout on a dial and a NOSCRIPT round trip.
		if err := l.central.Preload(ctx); err != nil && ctx.Err() == nil {
			l.opts.logger.Warn("hybridrate: preloading scripts", slog.Any("error", err))
		}
		l.central.WatchBans(ctx, central.BanWatch{Refresh: l.opts.banRefresh, Page: banPage, Sweep: banSweep,
			OnEvent: l.onBan, OnLoad: l.onBanList, OnTotal: l.onBanTotal,
			OnError: func(err error) { logs.failed(&logs.bans, err) }})
	}()
	return l, nil
}

// isNilClient catches a typed nil pointer inside the interface.
func isNilClient(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c == nil
	case *redis.ClusterClient:
		return c == nil
	case *redis.Ring:
		return c == nil
	}
	return false
}

// NodeID returns this limiter's node id, unique per limiter. It does no I/O.
func (l *Limiter) NodeID() string { return l.nodeID }

// Allow is shorthand for AllowN(ctx, key, limit, 1).
func (l *Limiter) Allow(ctx context.Context, key string, limit Limit) (bool, error) {
	return l.AllowN(ctx, key, limit, 1)
}

// AllowN reports whether n tokens may be taken for key under limit now, and takes them if so. It
// decides exactly as [Limiter.DecideN] does and returns only the answer's Allowed: callers that
// need the tokens left, the time to retry after a denial or who decided call DecideN. A decision
// from local allowance costs AllowN less than DecideN: its result fits in registers (a Decision
// does not: docs/design.md, "The hot path").
//
// A denial is not an error: err is non-nil only when no decision could be made — invalid input
// (ErrInvalidKey, ErrInvalidLimit, ErrInvalidCost), a closed limiter (ErrClosed) or a cancelled
// ctx. Keys are 1 to MaxKeyLen bytes of anything (braces and NUL bytes included); n is 1 to
// limit.Burst. A key has one bucket whatever its limit: a call with a new limit for a key changes
// the key's limit without resetting its consumption (see [Limit]). limit.OnFailure does not select
// the bucket either: it only says what this call gets while Redis cannot answer.
//
// Most calls are answered from local state without I/O or allocation. A call that must ask Redis
// waits at most the check timeout (WithCheckTimeout) and ctx.
func (l *Limiter) AllowN(ctx context.Context, key string, limit Limit, n int64) (bool, error) {
	// The fast path, DecideN's without the Decision (see valid).
	if l.valid(key, limit, n) && ctx.Err() == nil {
		h := l.store.Hash(key)
		if l.store.Take(key, h, limit.Rate, limit.Burst, n) != nil {
			if l.closed.Load() {
				return false, ErrClosed // see decide
			}
			return true, nil
		}
		return l.allowSlow(ctx, key, h, true, limit, n)
	}
	return l.allowSlow(ctx, key, 0, false, limit, n)
}

// allowSlow is AllowN after its fast path did not admit: DecideN's long way, reduced to Allowed.
// Out of line, so that AllowN's frame holds no Decision.
//
//go:noinline
func (l *Limiter) allowSlow(ctx context.Context, key string, h uint64, checked bool, limit Limit, n int64) (bool, error) {
	var d Decision
	var err error
	if checked {
		d, err = l.decide(ctx, key, h, limit, n)
	} else {
		d, err = l.allowN(ctx, key, limit, n)
	}
	return d.Allowed, err
}

// Decide is shorthand for DecideN(ctx, key, limit, 1).
func (l *Limiter) Decide(ctx context.Context, key string, limit Limit) (Decision, error) {
	return l.DecideN(ctx, key, limit, 1)
}

// DecideN decides as [Limiter.AllowN] does — it reports whether n tokens may be taken for key
// under limit now, and takes them if so — and returns the whole answer: besides Allowed, the
// estimate of the tokens left, the time to retry after a denial, the time until the bucket is
// full and who decided (see [Decision]). Its errors are AllowN's. Callers that need only the
// yes or no call AllowN, which is cheaper on the hot path.
func (l *Limiter) DecideN(ctx context.Context, key string, limit Limit, n int64) (Decision, error) {
	// The fast path: valid input, and the key's entry holding the limit and allowance for n and not
	// held (a key the deny cache holds has its entry held: see hold). It makes the checks allowN
	// makes, in one branch (valid, inlined, and ctx), and one call into the store
	// (local.Store.Take), which also counts the decision for Stats().Local in the entry (no locked
	// instruction of its own: see Stats); it does not look at the deny cache, so a ban of some other
	// key costs it nothing. A failed Take has taken nothing: the call goes on in decide with the key's hash;
	// input that fails a check goes the long way, allowN, which says why. AllowN's fast path is
	// this one without the Decision.
	if l.valid(key, limit, n) && ctx.Err() == nil {
		h := l.store.Hash(key)
		if e := l.store.Take(key, h, limit.Rate, limit.Burst, n); e != nil {
			if l.closed.Load() {
				return Decision{}, ErrClosed // see decide
			}
			rem := e.Remaining()
			return Decision{Allowed: true, Limit: limit, Remaining: rem, ResetAfter: resetAfter(limit, rem), Source: outcome.SourceLocal}, nil
		}
		return l.decide(ctx, key, h, limit, n) // the input is checked and the key hashed: go on from there
	}
	return l.allowN(ctx, key, limit, n)
}

// DecideLocalN is DecideN's fast path alone: when the input is valid, ctx is not done and key's
// entry holds limit and the allowance for n (and is not held: a key the deny cache holds has its
// entry held), it takes n and returns the Decision DecideN would and true. Otherwise it returns
// false, having taken nothing (but when Close began between the take and its check, as DecideN's
// fast path does), and the caller goes on with DecideN, which decides the same request the long
// way or returns ErrClosed. It never keeps key
// beyond the call, so key may be a string over a buffer the caller reuses (package policy builds its
// counter keys that way); it does no I/O and allocates nothing.
func (l *Limiter) DecideLocalN(ctx context.Context, key string, limit Limit, n int64) (Decision, bool) {
	if l.valid(key, limit, n) && ctx.Err() == nil {
		if e := l.store.Take(key, l.store.Hash(key), limit.Rate, limit.Burst, n); e != nil && !l.closed.Load() {
			rem := e.Remaining()
			return Decision{Allowed: true, Limit: limit, Remaining: rem, ResetAfter: resetAfter(limit, rem), Source: outcome.SourceLocal}, true
		}
	}
	return Decision{}, false
}

// valid reports whether the input passes allowN's checks (but ctx's, an interface call that would
// keep valid from being inlined) and the limiter is open: the fast paths' test, in one branch.
func (l *Limiter) valid(key string, limit Limit, n int64) bool {
	return !l.closed.Load() && len(key) != 0 && len(key) <= MaxKeyLen && limits.RateOK(limit.Rate, limit.Burst) &&
		uint(limit.OnFailure) <= uint(outcome.FailClosed) && n >= 1 && n <= limit.Burst
}

// allowN is DecideN's long way: each check with its own error, the deny cache, a limit change, an
// exhausted allowance and the calls to Redis.
//
//go:noinline
func (l *Limiter) allowN(ctx context.Context, key string, limit Limit, n int64) (Decision, error) {
	if l.closed.Load() {
		return Decision{}, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	if len(key) == 0 || len(key) > MaxKeyLen {
		return Decision{}, invalidKey(key)
	}
	if !limits.RateOK(limit.Rate, limit.Burst) || uint(limit.OnFailure) > uint(outcome.FailClosed) {
		return Decision{}, limit.Validate() // the same bounds, with the reason
	}
	if n < 1 || n > limit.Burst {
		return Decision{}, invalidCost(n, limit.Burst)
	}
	return l.decide(ctx, key, l.store.Hash(key), limit, n)
}

// decide is allowN after its checks, for valid input and h = l.store.Hash(key): the deny cache (for
// a key without an entry or with a held one), the local allowance, then Redis (slow).
//
//go:noinline
func (l *Limiter) decide(ctx context.Context, key string, h uint64, limit Limit, n int64) (Decision, error) {
	st := &l.counts[h&(numStripes-1)]
	e := l.store.Lookup(key, h)
	// A key with an entry that is not held is not in the deny cache (see hold): the cache, its
	// clock read and its lock are for keys without an entry and for held ones.
	if (e == nil || e.Held()) && !l.deny.Empty() {
		if d, ok := l.denied(key, limit); ok {
			st.deny.Add(1)
			return d, nil
		}
	}
	if e != nil {
		if e.Held() && !l.store.Release(e) {
			// The deny cache held the key when Release looked, though not when denied did just
			// before: a ban made in between. Release, like hold, runs under the store's lock, so
			// an entry released here is held again by any ban that was not seen.
			if d, ok := l.denied(key, limit); ok {
				st.deny.Add(1)
				return d, nil
			}
		}
		if !e.HasLimit(limit.Rate, limit.Burst) {
			e.SetLimit(limit.Rate, limit.Burst) // the key's limit changed: same entry, same bucket
		}
		if e.TryTake(n) == local.Taken {
			// Close sets closed before its final flush. A call that took tokens locally and still
			// sees closed false took them before Close began (Go's atomics are sequentially
			// consistent), so the final flush collects them. A call that sees closed true may have
			// taken them after the final flush, where they would never reach Redis: it reports
			// ErrClosed rather than an admission that could be forgotten. Its tokens may still be
			// flushed (an over-count of n, never an under-count). The same holds in slow.
			if l.closed.Load() {
				return Decision{}, ErrClosed
			}
			st.local.Add(1)
			rem := e.Remaining()
			return Decision{Allowed: true, Limit: limit, Remaining: rem, ResetAfter: resetAfter(limit, rem), Source: outcome.SourceLocal}, nil
		}
		if d, ok := l.starved(e, limit, n); ok {
			st.localDenied.Add(1)
			return d, nil
		}
	}
	return l.slow(ctx, key, h, limit, n)
}

// sweepIdle drops idle keys from the local store every WithIdleEviction interval until ctx ends
// (see local.Store.Sweep); it returns at once when idle eviction is off.
func (l *Limiter) sweepIdle(ctx context.Context) {
	d := l.opts.idleEviction
	if d <= 0 {
		return
	}
	every.Tick(ctx, d, func() { l.store.Sweep(l.mono(), int64(d)) })
}

// mono returns the time since the limiter started on the monotonic clock, in ns (always positive).
// Lease lives, retry times and the trust in Redis's last answer are measured on it; tests replace it
// (export_test.go's WithTestClock drives it and WithClock's clock from one fake clock).
func (l *Limiter) mono() int64 {
	if l.opts.mono != nil {
		return l.opts.mono()
	}
	return int64(time.Since(l.started)) + 1
}

// starved denies locally a key whose lease and credit are spent while Redis's last answer for this
// node, less than a second old, said the global bucket could not cover n. The demand is recorded,
// so that the syncer asks for a lease sized to it as soon as Redis's answer allows (its RetryAfter
// for this node's share of the refill, or at once). Asking Redis meanwhile would be denied too: at
// the limit such questions would cost a Redis command per request. The caller is told to retry once
// the refill could cover n and the syncer has asked (at least one sync interval). Never with a zero
// drift threshold (strict mode), never before the key's first answer, never on an answer older than
// a second (the decision then goes to Redis), and on a key whose demand the answer counted under its
// rate, never once the refill since the answer covers n: the bucket was emptied by leases held at
// other nodes, not by the key's load, and Redis may hold n again.
func (l *Limiter) starved(e *local.Entry, limit Limit, n int64) (Decision, bool) {
	if l.opts.drift == 0 {
		return Decision{}, false
	}
	at := e.GrantedAt()
	if at == 0 {
		return Decision{}, false
	}
	g, _ := e.Global()
	if g >= n*1_000_000 {
		return Decision{}, false // Redis had tokens beyond this node's lease: ask it
	}
	now := l.mono()
	if now-at > int64(starvedTrust) || (e.Under() && now >= e.RefillAt(n)) {
		return Decision{}, false
	}
	e.Deny(n)
	// The syncer asks again once Redis's answer allows it (RetryAt) and the bucket could hold a token
	// again; the caller is told to come back once n could have refilled and the syncer has asked
	// (two intervals later), so that a client honouring RetryAfter finds the renewed lease.
	until := max(e.RetryAt(), e.RefillAt(n))
	wait := max(time.Duration(until-now)+2*l.opts.syncInterval, l.opts.syncInterval)
	free := max(g/1_000_000, 0)
	return Decision{Limit: limit, RetryAfter: wait, ResetAfter: resetAfter(limit, free), Remaining: free, Source: outcome.SourceLocal}, true
}

// starvedTrust is how long Redis's answer that a key's bucket is empty lets a node deny locally.
const starvedTrust = time.Second

// coldCredit is the allowance of a key this node has never seen: min(max(2, drift·Burst/F),
// Burst/F) tokens, rounded down, with F the live limiters of the fleet registry, so that the
// fleet's cold-start credits on one key add up to one burst at most whatever the fleet's size
// (docs/accuracy.md); 0 when that is under a token (the key's first request here asks Redis), in
// strict mode or WithoutColdStart, and until the limiter is Ready: while the local copy of the ban
// list is not known to hold every ban (bansComplete), so that a banned key's first decision goes to
// Redis, and while the fleet's size is not known (fleetKnown), so that the nodes of a fleet that
// starts at once do not each size their credit for the part of the fleet that registered before
// them. Two tokens let the first requests of a new key (a client's first call is often followed by
// a second at once) be answered before its first reconcile on small fleets.
func (l *Limiter) coldCredit(limit Limit) int64 {
	if l.opts.drift == 0 || !l.opts.coldStart || !l.bansComplete() || !l.fleetKnown() {
		return 0
	}
	f := l.fleetSize.Load()
	return min(limit.Burst/f, max(2, int64(l.opts.drift*float64(limit.Burst)/float64(f))))
}

// invalidCost is AllowN's error for n out of 1 to burst; not inlined, so that formatting it does not
// widen AllowN's stack frame.
//
//go:noinline
func invalidCost(n, burst int64) error {
	return fmt.Errorf("%w: n=%d: want 1 to burst (%d)", ErrInvalidCost, n, burst)
}

func invalidKey(key string) error {
	if len(key) == 0 {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidKey, len(key), MaxKeyLen)
}

// resetAfter estimates the time until a bucket with rem tokens is full, capped at about 146 years so
// that a tiny rate cannot overflow the duration (found by FuzzAllowN).
func resetAfter(limit Limit, rem int64) time.Duration {
	missing := limit.Burst - rem
	if missing <= 0 {
		return 0
	}
	ns := float64(missing) / limit.Rate * float64(time.Second)
	if !(ns < 1<<62) {
		return 1 << 62
	}
	return time.Duration(ns)
}

// denied answers from the deny cache (bans).
func (l *Limiter) denied(key string, limit Limit) (Decision, bool) {
	now := l.opts.now()
	reason, until := l.deny.Check(key, now)
	if reason == denycache.None {
		return Decision{}, false
	}
	wait := until.Sub(now)
	return Decision{Limit: limit, RetryAfter: wait, ResetAfter: max(wait, 0), Source: outcome.SourceDenyCache}, true
}

// directToLease is how many of a key's decisions within a LeaseLife a node sends to Redis as one-off
// takes before it asks for leases: a node that sees a key this often can use a token of it within
// the lease's life.
const directToLease = 3

// thinLeaseRate: on a fleet larger than what Redis lends of a key (thinFleet), a node whose one-off
// takes of the key were all admitted asks for a lease only once it sends them at thinLeaseRate·
// Rate/Burst a second or more (direct). There a key under its rate keeps its burst in reserve but
// half the asking node's share (reconcile.lua), so a node's lease is about Burst·d/(2·W) for its
// demand d of the key's W ≤ Rate: two tokens or more (a lease that saves at least one call, as a
// leasing take costs Redis more than a one-off take) needs d ≥ 4·W/Burst. A node that
// sees the key at the uniform share of such a fleet, under Rate/Burst, never gets there; a key's
// home node (traffic pinned to one node) does.
const thinLeaseRate = 4

// thinFleet reports whether the fleet is larger than what Redis lends of a key of limit: its burst
// and the refill of the lease advance (reconcile.lua lends neither the advance nor in-flight refill
// there, and a node's share of the key is under a token at the uniform spread).
func (l *Limiter) thinFleet(limit Limit) bool {
	return float64(l.fleetSize.Load()) > float64(limit.Burst)+limit.Rate*l.opts.leaseAdvance.Seconds()
}

// directBreak is how many one-off takes within a LeaseLife end a thin answer's hold early (direct):
// a node whose demand for the key rose asks for a lease again.
const directBreak = 8 * directToLease

// thinLease is the least a leasing take's answer must leave a node beyond its request for the
// node to keep asking for leases on a fleet larger than the key's burst (direct): one token. (Two
// raised false denials of 3,000 keys of burst 10 on 12 nodes on the fleet simulator from 0.45% to
// 0.60%: a node holding one token was sent to one-off takes, and the syncer stopped renewing its
// lease.)
const thinLease = 1

// maxThinHold caps the hold after thin answers in a row (direct), in LeaseLives: 8 (64 s by default).
const maxThinHold = 8

// direct reports whether the decision of e, which this node holds no lease or credit for, should
// go to Redis as a one-off take (taken and counted at once, nothing leased, no node record): only
// when the fleet outnumbers the key's burst (the fleet registry's count: a node's share of the
// burst is under a token, so it has no cold-start credit either), and then
//   - after a leasing take's answer that left this node nothing beyond its request (thinLease): for
//     a hold of a LeaseLife, doubled for each such answer in a row before it (local.Entry.ThinRun),
//     at most maxThinHold LeaseLives, unless the node sends directBreak of the key's decisions to
//     Redis within a LeaseLife meanwhile;
//   - after an answer that left it more, less than a LeaseLife old: never;
//   - otherwise: while this node has sent fewer than directToLease of the key's decisions to Redis
//     within a LeaseLife (the next one asks for a lease, and learns its share from the answer);
//     and on a fleet larger than what Redis lends of the key (thinFleet), while they come at less
//     than thinLeaseRate·Rate/Burst a second, admitted or denied: a denial is no reason to lease,
//     since leases of a key over its rate wait at nodes that see it rarely (docs/accuracy.md).
//
// Such a node sees the key too rarely to use a lease before it expires. A one-off take costs Redis
// about what a central bucket's decision does (BenchmarkOneOffTakeRedisCPU); a leasing take more
// (reconcile.lua and the node's record: 11–12 against 9.3–9.7 µs a call back to back, more on
// buckets with tens of node records), and the syncer's report of the lease's use later. On the
// fleet simulator's per-user keys on 128 nodes (a node sees a key every 3.7 s), a fifth of the
// script calls were leasing takes that left nothing (a node's first after three one-off takes,
// then one every LeaseLife); 3% with the rate threshold and the hold (issue 21). Never in strict
// mode (drift 0), whose takes ask for exactly n.
func (l *Limiter) direct(e *local.Entry, limit Limit, now int64) bool {
	if l.opts.drift == 0 {
		return false
	}
	if f := l.fleetSize.Load(); f <= limit.Burst {
		return false
	}
	if at := e.GrantedAt(); at != 0 {
		if e.Thin() {
			hold := int64(LeaseLife) << min(max(e.ThinRun()-1, 0), bits.Len(maxThinHold)-1)
			if now-at < hold {
				return e.Direct(now, int64(LeaseLife)) < directBreak
			}
		} else if now-at < int64(LeaseLife) {
			return false
		}
	}
	if e.Direct(now, int64(LeaseLife)) < directToLease {
		return true
	}
	return l.thinFleet(limit) &&
		e.DirectRate(now, int64(LeaseLife)) < thinLeaseRate*limit.Rate/float64(limit.Burst)
}

// maxAttempts bounds how often one decision looks at the allowance again after another caller's
// call for the same key was answered, or after a lease that covered it was spent by other callers.
const maxAttempts = 3

// slow asks Redis, or the failure policy when Redis cannot answer.
func (l *Limiter) slow(ctx context.Context, key string, h uint64, limit Limit, n int64) (Decision, error) {
	st := &l.counts[h&(numStripes-1)]
	var e *local.Entry
	for {
		if e = l.insert(key, h, limit.Rate, limit.Burst, l.coldCredit(limit)); e == nil || !e.Evicted() {
			break
		}
	}
	if e != nil && !e.HasLimit(limit.Rate, limit.Burst) {
		e.SetLimit(limit.Rate, limit.Burst)
	}
	lim := central.Limit{Rate: limit.Rate, Burst: limit.Burst}
	var err error
	for attempt := 0; ; attempt++ {
		var u central.Update
		var seq uint64
		flying := false
		direct := false // a one-off take: nothing leased, nothing to apply to e
		sent := l.mono()
		if e != nil {
			e.Touch()
			// A new entry starts with its cold-start credit; another goroutine may have renewed the
			// lease while we waited for the lock or for Redis.
			if e.TryTake(n) == local.Taken {
				if l.closed.Load() {
					return Decision{}, ErrClosed // Close began meanwhile: see AllowN
				}
				st.local.Add(1)
				rem := e.Remaining()
				return Decision{Allowed: true, Limit: limit, Remaining: rem, ResetAfter: resetAfter(limit, rem), Source: outcome.SourceLocal}, nil
			}
			if d, ok := l.starved(e, limit, n); ok {
				st.localDenied.Add(1)
				return d, nil
			}
			if attempt == 0 && l.direct(e, limit, sent) {
				direct = true
				u = central.Update{Key: key, Limit: lim, Want: n, N: n}
			} else {
				if attempt < maxAttempts {
					if !e.Fly(n) {
						continue // another caller's call for this key was answered: look again
					}
					flying = true
				}
				c := e.Next(sent)
				// A node whose decisions of the key went to Redis as one-off takes has no demand
				// estimate of them (they are not its consumption): its first leasing take declares
				// their rate, so that Redis sizes its share (direct).
				c.Demand = max(c.Demand, e.DirectRate(sent, int64(LeaseLife)))
				want := n
				if l.opts.drift > 0 {
					want = min(max(l.syncer.Want(e, c.Demand, n), n+e.Waiters()), limit.Burst)
				}
				u = ratesync.Update(e, c, want, n)
				seq = c.Seq
			}
		} else {
			// No room locally: a one-off take (incarnation 0), counted by Redis at once.
			u = central.Update{Key: key, Limit: lim, Want: n, N: n}
		}

		sctx, span := l.tracer.Start(ctx, "hybridrate.take", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.Int64("hybridrate.n", n)))
		var res central.State
		if l.opts.upstream != nil {
			// The key passed the ban check above; a relay may admit a one-off take without Redis
			// only if that check saw every ban (issue 23, item 6).
			u.Vetted = u.Inc == 0 && l.bansComplete()
			// Bounded by the check timeout, as central.Client bounds a take.
			uctx, cancel := context.WithTimeout(sctx, l.opts.checkTimeout)
			res, err = l.opts.upstream.Take(uctx, l.nodeID, u)
			cancel()
		} else {
			res, err = l.central.Take(sctx, u)
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "take failed")
		}
		span.End()
		if err != nil {
			if flying {
				e.Land()
			}
			break
		}
		if res.Status == central.StatusBanned {
			// The key's ban is in its bucket: Redis applied this node's report, granted nothing and
			// took nothing.
			if e != nil && !direct {
				l.syncer.Apply(e, seq, u, res, sent)
				if flying {
					e.Land()
				}
				l.syncer.Watch(e)
			}
			st.deny.Add(1)
			return l.banned(key, limit, res.RetryAfter), nil
		}
		allowed := res.Status == central.StatusCovered
		if e != nil && !direct {
			l.syncer.Apply(e, seq, u, res, sent)
			if flying {
				e.Land()
			}
			l.syncer.Watch(e)
			// The answer renewed the node's lease; n is taken from it like any local decision.
			// Concurrent callers share the lease: one whose n was covered may find it spent by the
			// others' admissions, and asks again (twice at most) while Redis says it has tokens.
			switch e.TryTake(n) {
			case local.Taken:
				allowed = true
				// On a fleet larger than the burst, an answer that left nothing beyond n (less than
				// thinLease) sends this node's next decisions of the key to Redis as one-off takes,
				// and tells the syncer not to ask for a lease Redis would not give (direct).
				e.SetThin(l.fleetSize.Load() > limit.Burst && e.Mark()-e.Total() < thinLease)
			case local.Gone:
				// The entry was evicted meanwhile. A covered n was charged to its lease and counted
				// by Redis for this very request: admit it.
				allowed = res.Status == central.StatusCovered
			default:
				allowed = false
				if res.Status == central.StatusCovered {
					if attempt < maxAttempts {
						continue
					}
					// Redis covered n and counted it for this very request, but the node's
					// allowance does not show it: the answer was not applied (the answer to a later
					// call of the key was applied first) or the lease was written off while the call
					// was in flight. A denial here would leave Redis counting n tokens nobody was
					// admitted; the last attempt admits n against that charge instead, recorded as
					// the node's consumption (debt, if beyond what it was charged), as Gone does.
					e.Add(n)
					allowed = true
				}
			}
			if !allowed && res.RetryAfter == 0 {
				res.RetryAfter = time.Duration(float64(time.Second) / limit.Rate)
			}
		}
		rem := max(res.Tokens/1_000_000, 0)
		if e != nil && !direct {
			rem = e.Remaining() // the bucket and this node's unused lease
		}
		if allowed {
			if l.closed.Load() {
				return Decision{}, ErrClosed // Close began meanwhile: see AllowN
			}
			st.central.Add(1)
			return Decision{Allowed: true, Limit: limit, Remaining: rem, ResetAfter: res.ResetAfter, Source: outcome.SourceCentral}, nil
		}
		st.centralDenied.Add(1)
		return Decision{Limit: limit, Remaining: rem, RetryAfter: max(res.RetryAfter, time.Microsecond), ResetAfter: res.ResetAfter, Source: outcome.SourceCentral}, nil
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(cerr, context.DeadlineExceeded) {
		return Decision{}, cerr
	}
	if errors.Is(err, central.ErrInvalid) {
		return Decision{}, fmt.Errorf("hybrid: %w", err)
	}
	// Every other failure — transport, a server refusing writes, a key Redis cannot process — is the
	// failure policy's to decide, never the caller's error.
	d := l.failure(key, e, limit, n)
	if d.Allowed && l.closed.Load() {
		return Decision{}, ErrClosed // Close began meanwhile: see AllowN
	}
	return d, nil
}

// failure applies the limit's failure policy (or, for outcome.DefaultFailure, the limiter's) to a decision
// Redis could not make.
func (l *Limiter) failure(key string, e *local.Entry, limit Limit, n int64) Decision {
	st := &l.counts[0]
	d := Decision{Limit: limit, Source: outcome.SourceFallback}
	excused := int64(0) // of the n admitted, paid for by the bucket's refill (outcome.LocalFallback)
	switch l.failurePolicy(limit) {
	case outcome.FailOpen:
		d.Allowed = true
	case outcome.FailClosed:
		d.RetryAfter, d.Unavailable = breakerCooldown, true
	default:
		active := l.fallbackShare(e)
		r := limit.Rate / float64(active)
		b := max(limit.Burst/active, n, 1)
		now := l.opts.now()
		fb, ok := l.fallback.Get(key)
		if !ok || e != nil && e.GrantedAt() > fb.born {
			// A bucket for this outage: an answer from Redis since the last one was made ended that
			// outage, and this one starts from what the answer said.
			fb = l.newFallback(e, active, r, b, now)
			l.fallback.Add(key, fb)
		}
		var retry time.Duration
		d.Allowed, retry, excused = fb.take(now, r, b, n)
		if !d.Allowed {
			d.RetryAfter = retry
		}
	}
	if d.Allowed {
		st.fallbackAllowed.Add(1)
		l.record(e, n, excused)
	} else {
		st.fallbackDenied.Add(1)
	}
	return d
}

// ban puts key in the deny cache until until, and holds its entry (see hold).
func (l *Limiter) ban(key string, until time.Time) {
	l.deny.Ban(key, until)
	l.hold(key)
}

// hold holds key's entry, if it has one (local.Store.Hold), so that the fast path, which does not
// look at the deny cache, sends the key's decisions to decide, which does. Every write of a key to
// the deny cache is followed by hold; the store creates the entry of a key the deny cache holds
// held (local.Config.Held), and releases an entry only when the cache no longer holds its key
// (local.Store.Release, which decide calls). Hold, insert and release run under the store's shard
// lock, so a decision that starts after ban returned never takes from an unheld entry of the key,
// whether the entry was inserted before the ban or after it.
func (l *Limiter) hold(key string) { l.store.Hold(key, l.store.Hash(key)) }

// insert is local.Store.Insert; the store holds the entry of a key the deny cache holds (see hold).
func (l *Limiter) insert(key string, h uint64, rate float64, burst, credit int64) *local.Entry {
	return l.store.Insert(key, h, rate, burst, credit)
}

// record counts tokens admitted without Redis so that they are applied to Redis later: all n as
// admitted, n − excused as debt (local.Entry.AddExcused).
func (l *Limiter) record(e *local.Entry, n, excused int64) {
	if e == nil {
		l.counts[0].unrecorded.Add(n)
		return
	}
	for e.AddExcused(n, excused) == local.Gone {
		rate, burst := e.Limit()
		if e = l.insert(e.Key(), l.store.Hash(e.Key()), rate, burst, 0); e == nil {
			l.counts[0].unrecorded.Add(n)
			return
		}
	}
}

// Ban makes every node deny key for d (at least 1ms), within one sync interval; this node at once.
// It makes one Redis call (the ban list, its change log and a Pub/Sub message). Errors:
// [ErrClosed]; [ErrInvalidKey] (wrapped) for an empty or oversized key; otherwise the Redis call's
// error, wrapped, and the ban may not have been made.
func (l *Limiter) Ban(ctx context.Context, key string, d time.Duration) error {
	if l.closed.Load() {
		return ErrClosed
	}
	if len(key) == 0 || len(key) > MaxKeyLen {
		return invalidKey(key)
	}
	if err := l.central.Ban(ctx, key, d); err != nil {
		return fmt.Errorf("hybrid: %w", err)
	}
	l.ban(key, l.opts.now().Add(d))
	return nil
}

// Unban lifts a ban on every node. It makes one Redis call. Errors: [ErrClosed]; [ErrInvalidKey]
// (wrapped); otherwise the Redis call's error, wrapped, and the ban may still stand.
func (l *Limiter) Unban(ctx context.Context, key string) error {
	if l.closed.Load() {
		return ErrClosed
	}
	if len(key) == 0 || len(key) > MaxKeyLen {
		return invalidKey(key)
	}
	if err := l.central.Unban(ctx, key); err != nil {
		return fmt.Errorf("hybrid: %w", err)
	}
	l.deny.Unban(key)
	return nil
}

func (l *Limiter) onBan(ev central.BanEvent) {
	if ev.Banned {
		l.ban(ev.Key, l.opts.now().Add(ev.TTL))
	} else {
		l.deny.Unban(ev.Key)
	}
}

func (l *Limiter) onBanList(bans []central.BanEvent) {
	now := l.opts.now()
	m := make(map[string]time.Time, len(bans))
	for _, b := range bans {
		m[b.Key] = now.Add(b.TTL)
	}
	l.deny.ReplaceBans(m)
	for k := range m {
		l.hold(k)
	}
}

// Flush reconciles all pending consumption with Redis now. It returns the first error; consumption
// that failed to reconcile stays pending.
func (l *Limiter) Flush(ctx context.Context) error {
	if l.closed.Load() {
		return ErrClosed
	}
	return l.flush(ctx)
}

func (l *Limiter) flush(ctx context.Context) error {
	ctx, span := l.tracer.Start(ctx, "hybridrate.flush", trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	err := l.syncer.Flush(ctx)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "flush failed")
	}
	return err
}

// Close stops the background loop, flushes pending consumption (bounded by ctx) and releases the
// limiter's goroutines and metric callbacks. A call racing with Close either is admitted before
// Close begins, and flushed, or returns ErrClosed (its tokens may then still be flushed: an
// over-count, never a forgotten admission). If the circuit breaker is open, Close waits out one
// cooldown, within ctx, before its last attempt. Close is safe to call more than once; later calls
// return nil. After Close, AllowN and DecideN return ErrClosed.
func (l *Limiter) Close(ctx context.Context) error {
	if !l.closed.CompareAndSwap(false, true) {
		return nil
	}
	l.cancel()
	l.wg.Wait()
	err := l.syncer.Release(ctx)
	if err == nil {
		_ = l.central.Leave(ctx) // the others' fleet count drops now, not after the heartbeat's TTL
	}
	// A burst of slow calls can leave the breaker open at shutdown while Redis is healthy, and an
	// open breaker sends nothing: wait out one cooldown (bounded by ctx) and try once more before
	// giving up on the pending consumption.
	if errors.Is(err, central.ErrUnavailable) {
		t := time.NewTimer(breakerCooldown)
		select {
		case <-ctx.Done():
		case <-t.C:
			err = l.syncer.Release(ctx)
		}
		t.Stop()
	}
	for i := 0; i < 3 && err == nil && l.store.Dirty() > 0; i++ {
		runtime.Gosched()
		err = l.syncer.Flush(ctx)
	}
	if merr := l.metrics.close(); merr != nil && err == nil {
		err = merr
	}
	_ = l.central.Close() // the cluster client it may have created for itself; never rdb
	if err != nil {
		return fmt.Errorf("hybrid: close: final flush: %w", err)
	}
	return nil
}

// failurePolicy returns the policy that answers for limit while Redis cannot: its own, or the
// limiter's default.
func (l *Limiter) failurePolicy(limit Limit) outcome.FailurePolicy {
	if limit.OnFailure == outcome.DefaultFailure {
		return l.opts.policy
	}
	return limit.OnFailure
}
