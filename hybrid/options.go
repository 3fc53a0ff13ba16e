package hybrid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/limits"
	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/outcome"
)

// The defaults, all in one place.
const (
	DefaultSyncInterval   = 20 * time.Millisecond
	DefaultDriftThreshold = 0.1
	DefaultKeyPrefix      = "hr"
	DefaultMaxKeys        = 1 << 20
	// DefaultIdleEviction is the default of WithIdleEviction.
	DefaultIdleEviction = 10 * time.Minute
	DefaultCheckTimeout = 5 * time.Millisecond
	DefaultFlushTimeout = 500 * time.Millisecond
	// MaxKeyLen is the longest key AllowN and DecideN accept, in bytes; the same bound as
	// concurrency.MaxKeyLen and strict.MaxKeyLen.
	MaxKeyLen = limits.MaxKeyLen
	// LeaseHorizon is how long a lease should last at a node's demand on a key: its size is the
	// demand × LeaseHorizon, within the node's demand-weighted share of the burst.
	LeaseHorizon = 4 * time.Second
	// LeaseLife is how long a node may use a lease after asking for it; what is left is then written
	// off. It bounds how long leased tokens can sit unused while the bucket refills
	// (docs/accuracy.md).
	LeaseLife = 8 * time.Second
	// LeaseAdvance is the default of WithLeaseAdvance: lease renewals (not a node's first call for a
	// key) may draw on what the key's demand takes of the next second's refill while the key is
	// under its rate, and over it on the refill its leases hold while they wait.
	LeaseAdvance = time.Second
)

// Tunables that have no option yet; documented in docs/operations.md.
const (
	breakerCooldown = redisx.DefaultBreakerCooldown // open time before a probe (the breakers use redisx.DefaultBreaker)
	scriptBatch     = 256                           // keys per reconcile script call
	flushBatch      = 4096                          // keys per pipelined reconcile
	recountPeriod   = time.Minute                   // Redis scans a key's node records for departed nodes this often
	pruneAge        = 10 * time.Minute              // a node's record on a key is dropped after this
	banRefresh      = 10 * time.Second              // change-log read period (Pub/Sub carries changes at once)
	banPage         = 10000                         // bans per page of the ban-list reads
	banSweep        = 1000                          // ban-list entries swept for expiry per refresh
	banCheckEvery   = time.Second                   // a key is checked in Redis's ban list at most this often
	maxBanChecks    = 1 << 16                       // keys checked per banCheckEvery at most
	maxDenied       = 1 << 16                       // cached Redis denials
	maxBans         = 1 << 16                       // bans held locally; more are checked in Redis
	maxFallback     = 1 << 16                       // keys with an outcome.LocalFallback limiter
	logSummaryEvery = 10 * time.Second              // at most one line per kind of background failure this often
	evictionCheck   = time.Minute                   // how often Redis's maxmemory-policy is read
)

// breakerConfig is the breakers' configuration: the defaults every package uses (redisx.DefaultBreaker)
// and onChange.
func breakerConfig(onChange func(redisx.BreakerEvent)) redisx.BreakerConfig {
	cfg := redisx.DefaultBreaker()
	cfg.OnStateChange = onChange
	return cfg
}

// Option configures a [Limiter]; see the With functions. Options are immutable values, safe to
// share between goroutines and to pass to several New calls.
type Option interface{ option.Setter[options] }

type optionFunc = option.Func[options]

type options struct {
	syncInterval   time.Duration
	drift          float64
	policy         outcome.FailurePolicy
	prefix         string
	maxKeys        int
	idleEviction   time.Duration
	checkTimeout   time.Duration
	flushTimeout   time.Duration
	now            func() time.Time
	logger         *slog.Logger
	meterProvider  metric.MeterProvider
	tracerProvider trace.TracerProvider
	nodeID         string
	coldStart      bool
	leaseAdvance   time.Duration
	instance       string
	upstream       Upstream
	evictionCheck  time.Duration // not an option; tests shorten it
	banRefresh     time.Duration // not an option; tests shorten it
	fleetBeat      time.Duration // not an option; tests shorten it
	maxBans        int           // not an option; tests shrink it
	mono           func() int64  // not an option; tests drive the monotonic clock (nil: time since New)
	scriptNow      func() int64  // not an option; the fleet simulator's script time in µs (nil: Redis TIME)
	manual         bool          // not an option; the fleet simulator steps the limiter (no background goroutines)
}

func defaultOptions() options {
	return options{
		syncInterval:   DefaultSyncInterval,
		drift:          DefaultDriftThreshold,
		policy:         outcome.LocalFallback,
		prefix:         DefaultKeyPrefix,
		maxKeys:        DefaultMaxKeys,
		idleEviction:   DefaultIdleEviction,
		checkTimeout:   DefaultCheckTimeout,
		flushTimeout:   DefaultFlushTimeout,
		now:            time.Now,
		logger:         slog.New(slog.DiscardHandler),
		meterProvider:  otel.GetMeterProvider(),
		tracerProvider: otel.GetTracerProvider(),
		coldStart:      true,
		leaseAdvance:   LeaseAdvance,
		evictionCheck:  evictionCheck,
		banRefresh:     banRefresh,
		fleetBeat:      fleetBeat,
		maxBans:        maxBans,
	}
}

// ErrBadOption is wrapped by every option error from [New].
var ErrBadOption = errors.New("hybrid: bad option")

func badOption(format string, args ...any) error { return option.Bad(ErrBadOption, format, args...) }

// WithSyncInterval sets how often the background loop looks for keys that need Redis (debt to
// report, a lease nearly spent, a renewal Redis asked for), from 1ms to 1 minute. It sets how early
// a lease is renewed (a few intervals of demand before it runs out) and how long a debt waits; a
// key with lease to spare is not sent, whatever the interval. The default is 20ms.
func WithSyncInterval(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d < time.Millisecond || d > time.Minute {
			return badOption("sync interval %v out of range [1ms, 1m]", d)
		}
		o.syncInterval = d
		return nil
	})
}

// WithDriftThreshold sets the overdraft credit a node may consume beyond its lease, as a fraction of
// the global tokens Redis last reported, split between the nodes sharing the key (at least one
// token while the bucket is not empty), and the cold-start credit of a new key (that fraction of
// the burst, at least two tokens). 0 disables leases and credits: every decision goes to Redis (a
// strict central limiter). Larger values widen the overshoot bound of docs/accuracy.md. From 0 to
// 1; the default is 0.1.
func WithDriftThreshold(f float64) Option {
	return optionFunc(func(o *options) error {
		if !(f >= 0 && f <= 1) {
			return badOption("drift threshold %v out of range [0, 1]", f)
		}
		o.drift = f
		return nil
	})
}

// WithFailurePolicy sets what happens while Redis cannot answer a decision that needs it (the
// circuit breaker is open, or the synchronous check failed or timed out) to limits whose OnFailure
// is outcome.DefaultFailure; a [Limit] may carry its own policy in Limit.OnFailure, so that one
// limiter serves limits with different policies. Keys with local allowance left keep using it
// whatever the policy. The default is outcome.LocalFallback (as is
// WithFailurePolicy(outcome.DefaultFailure)). In a Limiter the policies mean:
//
//   - outcome.LocalFallback enforces, on this node, its share of the global limit (Rate/A, at least
//     one token of burst, where A is the smaller of the live fleet, Limiter.FleetSize, and the nodes
//     Redis last reported on the key) with golang.org/x/time/rate until Redis is back, from a bucket
//     that starts at this node's share of what Redis last reported (never a fresh burst). Admitted
//     tokens are counted and applied to Redis later; of them, only those the bucket's own refill
//     over the outage does not pay for are charged as debt, so a key that stayed under its limit is
//     not denied after the outage (docs/accuracy.md, "Outages").
//   - outcome.FailOpen admits every request; admitted tokens are counted and applied to Redis later.
//   - outcome.FailClosed denies every request that needs Redis; the [Decision] is marked
//     Unavailable.
func WithFailurePolicy(p outcome.FailurePolicy) Option {
	return optionFunc(func(o *options) (err error) {
		o.policy, err = option.FailurePolicy(ErrBadOption, p)
		return err
	})
}

// WithoutColdStart makes the first decision for a key this node has not seen (or has evicted) go to
// Redis synchronously. By default it is admitted locally from a cold-start credit of max(2,
// DriftThreshold·Burst/A) tokens, at most Burst (A: the largest number of nodes sharing a key that
// Redis's answers showed), while the key's state is fetched in the background; that credit enters
// the overshoot bound of docs/accuracy.md. Use this option for limits that must never be exceeded.
func WithoutColdStart() Option {
	return optionFunc(func(o *options) error {
		o.coldStart = false
		return nil
	})
}

// WithLeaseAdvance lets Redis lend, as leases, refill that has not come yet: while a key's demand W
// is under its rate, a node's lease renewal may draw on what that demand takes of the next d
// (W·d tokens, at most Rate·d; the bucket may be lent down to -Rate·d, which the refill repays
// because the demand is below the rate). Leases then last longer than a share of the burst allows:
// fewer Redis calls per decision for keys whose burst is small next to their rate or split over
// many nodes. A node's first call for a key never draws on the advance, and a key that was quiet
// has no demand to lend ahead for, so a burst on a quiet key takes at most its burst. The price: a
// key that has run at W under its rate holds leases that include refill lent ahead, so a sudden
// burst on it can admit up to Burst + W·d at once, and the overshoot bound widens by Rate·d
// (docs/accuracy.md). At or over its rate a key lends instead the refill its leases hold while
// they wait for their nodes' next requests (Rate/d_i tokens for node i of demand d_i, at most
// Rate·d), so that an overloaded key spread over many nodes admits what an exact bucket would. The
// default, LeaseAdvance, is one second; 0 lends only tokens in the bucket (a burst then exceeds
// Burst only by the overdraft credits and by what leases taken before the bucket refilled still
// hold: docs/accuracy.md, "The bound"). From 0 to a minute; every node of a fleet should use the same.
func WithLeaseAdvance(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d < 0 || d > time.Minute {
			return badOption("lease advance %v out of range [0, 1m]", d)
		}
		o.leaseAdvance = d
		return nil
	})
}

// WithKeyPrefix sets the prefix of every Redis key, so that several applications can share a Redis.
// It must be non-empty, at most 64 bytes, with no braces or whitespace. The default is "hr".
func WithKeyPrefix(p string) Option {
	return optionFunc(func(o *options) (err error) {
		o.prefix, err = option.KeyPrefix(ErrBadOption, p)
		return err
	})
}

// WithMaxKeys caps the number of keys held in local memory (at least 64). When the cap is reached,
// keys with nothing pending are evicted, least recently used first; their state is in Redis. The
// default is 1<<20. Each key held costs the same heap whatever its limit (its entry and table slot;
// the key string is the caller's, kept as passed), so the cap bounds the store's memory linearly;
// docs/operations.md ("Sizing Redis") gives the bytes per key and what the syncer adds for a key
// it watches.
func WithMaxKeys(n int) Option {
	return optionFunc(func(o *options) error {
		if n < 64 {
			return badOption("max keys %d: want at least 64", n)
		}
		o.maxKeys = n
		return nil
	})
}

// WithIdleEviction drops from local memory, every d, the keys that were not used since the previous
// time and have nothing pending (Redis counted all their consumption), once their last answer from
// Redis is at least d and their bucket's refill time (Burst/Rate) old: a key idle for between d and
// 2d. The tables they leave mostly empty shrink, so an idle limiter's memory goes back to the
// runtime, and from it to the OS. A dropped key that is used again starts as a key this node never
// saw (a cold-start credit, or a call to Redis). 0 turns it off: keys then leave only when the cap
// (WithMaxKeys) needs room. The default is DefaultIdleEviction (10 minutes).
func WithIdleEviction(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d < 0 {
			return badOption("idle eviction %v: want 0 (off) or more", d)
		}
		o.idleEviction = d
		return nil
	})
}

// WithCheckTimeout bounds the synchronous Redis check that a decision makes when local allowance
// cannot answer it (one script call, round trip included), from 100µs to 10s. A check that times out
// is answered by the failure policy. It does not bound the background loop's calls (see
// WithFlushTimeout). Checks that keep timing out (5 in a row over at least 50ms) are suspended, so
// that decisions needing Redis go to the failure policy at once, with one probe every 500ms; they
// do not stop the background loop, which keeps renewing leases from a Redis slower than the check
// timeout but faster than the flush timeout (docs/operations.md, "Slow Redis"). The default is 5ms
// (DefaultCheckTimeout).
func WithCheckTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d < 100*time.Microsecond || d > 10*time.Second {
			return badOption("check timeout %v out of range [100µs, 10s]", d)
		}
		o.checkTimeout = d
		return nil
	})
}

// WithFlushTimeout bounds one background reconcile (one pipeline round), from 1ms to 1 minute. The
// default is 500ms.
func WithFlushTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d < time.Millisecond || d > time.Minute {
			return badOption("flush timeout %v out of range [1ms, 1m]", d)
		}
		o.flushTimeout = d
		return nil
	})
}

// WithClock sets the clock used for deny-cache deadlines and the outcome.LocalFallback limiter (nil means
// time.Now). Global refill never uses it: Redis TIME is the only clock of the global state.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(o *options) error {
		if now == nil {
			now = time.Now
		}
		o.now = now
		return nil
	})
}

// Upstream serves a limiter's leases instead of Redis: a relay (package relay) that holds leases in
// Redis for the limiters of its host or zone, so that Redis sees the relays rather than every
// process (docs/design.md, "Any fleet size"). node is the calling limiter's node id. Reconcile and
// Take have the terms of central.Client's methods of the same names: Take's error is handled as a
// failed Redis call (the failure policy decides), Reconcile's as a failed background round. Its
// methods are called from many goroutines at once (the hot path's takes and the background rounds):
// an implementation must be safe for concurrent use.
type Upstream interface {
	Reconcile(ctx context.Context, node string, updates []central.Update, out []central.State, errs []error) error
	Take(ctx context.Context, node string, u central.Update) (central.State, error)
}

// WithUpstream sends the limiter's lease traffic (its background reconciles and its synchronous
// takes) to u instead of Redis. Everything else still talks to Redis through the client given to
// New: the ban list, peeks and resets, and the fleet registry (the limiter counts in the fleet as
// before, so its overdraft and cold-start credits are its share of the whole fleet's budget).
func WithUpstream(u Upstream) Option {
	return optionFunc(func(o *options) error {
		if u == nil {
			return badOption("nil upstream")
		}
		o.upstream = u
		return nil
	})
}

// WithLogger sets where background errors are logged. The default discards them (they are also
// counted in metrics).
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) (err error) {
		o.logger, err = option.NonNil(ErrBadOption, "logger", l)
		return err
	})
}

// WithMeterProvider sets the OpenTelemetry meter provider. The default is otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(o *options) error {
		if mp == nil {
			return badOption("nil meter provider")
		}
		o.meterProvider = mp
		return nil
	})
}

// WithTracerProvider sets the OpenTelemetry tracer provider for spans around Redis round trips. The
// default is otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(o *options) error {
		if tp == nil {
			return badOption("nil tracer provider")
		}
		o.tracerProvider = tp
		return nil
	})
}

// WithNodeID sets this limiter's node id (1 to 64 bytes of [A-Za-z0-9_-]). Every limiter must have
// its own; the default is random, which is what almost every caller wants. Reusing the id of a
// limiter that is still running corrupts both limiters' accounting.
func WithNodeID(id string) Option {
	return optionFunc(func(o *options) error {
		if id == "" || len(id) > 64 || strings.IndexFunc(id, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
		}) >= 0 {
			return badOption("node id %q: want 1 to 64 bytes of [A-Za-z0-9_-]", id)
		}
		o.nodeID = id
		return nil
	})
}

// WithInstance sets the value of the hybridrate.instance attribute on this limiter's metrics: a
// stable name for the process (a pod name, say), the same across restarts, unlike the node id. It
// must be 1 to 128 bytes. The default is the host name (os.Hostname), or "unknown". Limiters of one
// process share it; their metrics differ by their failure policy (the hybridrate.failure_policy
// attribute), so give limiters of one process with the same failure policy distinct instances.
func WithInstance(name string) Option {
	return optionFunc(func(o *options) error {
		if name == "" || len(name) > 128 {
			return badOption("instance %q: want 1 to 128 bytes", name)
		}
		o.instance = name
		return nil
	})
}

// Limit is a token bucket: Rate tokens per second refill a bucket that holds at most Burst tokens.
// Rate must be finite, from 1e-9 (one token in 31.7 years) to 1e9; Burst from 1 to 1e9.
//
// A key has one bucket whatever its limit: the limit is not part of the bucket's identity (neither
// in Redis, "<prefix>:v6:b:{key}", nor in this process). To change a key's limit without resetting
// it, call with the same key and the new Limit: the key keeps its consumption, its tokens are
// clamped to the new Burst and refill at the new Rate from the change on, and this node's lease
// and credit are kept (they were charged to the same bucket, so nothing is granted twice). Nodes
// that use different limits for one key at the same time (a rolling deploy, a reload that reaches
// some nodes first) count in that one bucket: each call to Redis applies the limit it carries, so
// the latest call's limit refills the bucket and each node's lease is sized by the limit it sent
// (docs/accuracy.md, "One key, two limits"). Two limits that must be enforced separately need two
// keys (package policy puts the rule's name in its keys).
//
// OnFailure is what the limit does while Redis cannot answer; the zero value, outcome.DefaultFailure, is the
// limiter's default (WithFailurePolicy). Calls for one key with different OnFailure share the same
// tokens, locally and in Redis, and each call's own OnFailure decides when Redis is away. So one
// [Limiter] can serve limits of every policy. The zero Limit is invalid (Validate says why). A
// Limit is a plain value, safe to copy and share.
type Limit struct {
	Rate      float64
	Burst     int64
	OnFailure outcome.FailurePolicy
}

// PerSecond returns a limit of n per second with a burst of n.
func PerSecond(n int64) Limit { return Limit{Rate: float64(n), Burst: n} }

// PerMinute returns a limit of n per minute with a burst of n.
func PerMinute(n int64) Limit { return Limit{Rate: float64(n) / 60, Burst: n} }

// PerHour returns a limit of n per hour with a burst of n.
func PerHour(n int64) Limit { return Limit{Rate: float64(n) / 3600, Burst: n} }

// Validate reports why l cannot be used, or nil. The error wraps [ErrInvalidLimit]. It does no I/O.
func (l Limit) Validate() error {
	if err := limits.CheckRate(l.Rate, l.Burst); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidLimit, err)
	}
	if !l.OnFailure.Valid() {
		return fmt.Errorf("%w: unknown failure policy %d", ErrInvalidLimit, int(l.OnFailure))
	}
	return nil
}

// FailurePolicy returns the limiter's default failure policy (WithFailurePolicy): the one limits with
// OnFailure outcome.DefaultFailure use. It is never outcome.DefaultFailure. It does no I/O.
func (l *Limiter) FailurePolicy() outcome.FailurePolicy { return l.opts.policy }

// upstreamPort is the syncer's view of an Upstream: its calls carry the limiter's node id.
// A call is bounded by the flush timeout, as central.Client bounds its own.
type upstreamPort struct {
	u       Upstream
	node    string
	timeout time.Duration
}

func (p upstreamPort) Reconcile(ctx context.Context, updates []central.Update, out []central.State, errs []error) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	return p.u.Reconcile(ctx, p.node, updates, out, errs)
}
