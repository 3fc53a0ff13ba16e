package concurrency

import (
	"errors"
	"log/slog"
	"time"

	"github.com/hybridrate/hybridrate/internal/limits"
	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/outcome"
)

// Defaults and bounds.
const (
	// DefaultKeyPrefix is the prefix of every Redis key unless [WithKeyPrefix] says otherwise; it is
	// package hybrid's default too (the two never share a key name: see [Limiter]).
	DefaultKeyPrefix = "hr"
	// DefaultTimeout bounds each Redis call unless [WithTimeout] says otherwise.
	DefaultTimeout = 50 * time.Millisecond
	// MaxKeyLen is the longest key the Limiter accepts, in bytes; the same bound as hybrid.MaxKeyLen
	// and strict.MaxKeyLen.
	MaxKeyLen = limits.MaxKeyLen
	// MaxLimit is the largest limit the Limiter accepts.
	MaxLimit = 1 << 20
	// MaxTTL is the longest lease time to live the Limiter accepts.
	MaxTTL = 24 * time.Hour
)

// Layout is the version of the Redis key layout of this package: "<prefix>:v1:c:{<key>}".
const Layout = "v1"

// internal tunables, not options.
const (
	pollMin = 2 * time.Millisecond  // Acquire's first wait between tries
	pollMax = 50 * time.Millisecond // and its longest
)

// Option configures a [Limiter]; see the With functions. Options are immutable values, safe to
// share between goroutines and to pass to several New calls.
type Option interface{ option.Setter[options] }

type optionFunc = option.Func[options]

type options struct {
	prefix  string
	policy  outcome.FailurePolicy
	nodes   int
	timeout time.Duration
	logger  *slog.Logger
	now     func() time.Time // the local clock of fallback leases; tests replace it
}

func defaultOptions() options {
	return options{
		prefix:  DefaultKeyPrefix,
		policy:  outcome.LocalFallback,
		nodes:   1,
		timeout: DefaultTimeout,
		logger:  slog.New(slog.DiscardHandler),
		now:     time.Now,
	}
}

// ErrBadOption is wrapped by every option error from [New].
var ErrBadOption = errors.New("concurrency: bad option")

func badOption(format string, args ...any) error { return option.Bad(ErrBadOption, format, args...) }

// WithKeyPrefix sets the prefix of every Redis key, so that several applications can share a Redis.
// It must be 1 to 64 bytes with no braces or whitespace. The default is DefaultKeyPrefix ("hr").
func WithKeyPrefix(p string) Option {
	return optionFunc(func(o *options) (err error) {
		o.prefix, err = option.KeyPrefix(ErrBadOption, p)
		return err
	})
}

// WithFailurePolicy sets what TryAcquire and Acquire do when Redis cannot decide: the call failed
// or timed out, the circuit breaker is open, Redis refused the call (OOM, READONLY, NOAUTH, …), or
// the key could not be used (WRONGTYPE: something else owns the Redis key). The default is
// outcome.LocalFallback, which outcome.DefaultFailure also selects. In a Limiter the policies mean:
//
//   - outcome.LocalFallback admits up to this node's share of the limit, max(1, limit/nodes) leases
//     per key (nodes: [WithNodes]), counted in a local semaphore with the same TTLs, until Redis is
//     back.
//   - outcome.FailOpen admits every request.
//   - outcome.FailClosed denies every request; the lease is marked Unavailable
//     ([Lease.Unavailable]).
func WithFailurePolicy(p outcome.FailurePolicy) Option {
	return optionFunc(func(o *options) (err error) {
		o.policy, err = option.FailurePolicy(ErrBadOption, p)
		return err
	})
}

// WithNodes sets the number of nodes that share the limits, from 1 to 10000: under outcome.LocalFallback each
// node admits max(1, limit/nodes) leases per key while Redis is away, so the fleet stays near the
// limit. The default is 1 (each node alone may then admit the whole limit while Redis is away).
func WithNodes(n int) Option {
	return optionFunc(func(o *options) error {
		if n < 1 || n > 10000 {
			return badOption("nodes %d: want 1 to 10000", n)
		}
		o.nodes = n
		return nil
	})
}

// WithTimeout bounds each Redis call, from 1ms to 10s; a call that takes longer counts as a failure
// and the failure policy decides. The default is DefaultTimeout (50ms). The bound holds on a hung
// Redis whatever the client's options: a *redis.Client (a Sentinel failover client too) created
// without ContextTimeoutEnabled is used through a shallow copy with socket timeouts of d, sharing its
// connection pool; a *redis.ClusterClient created without it, through a new cluster client built
// from its options with ContextTimeoutEnabled and socket timeouts of d, with connections of its own,
// which [Limiter.Close] closes. Neither runs the hooks added to the client (AddHook): create the
// client with ContextTimeoutEnabled: true to keep them, and it is used as is.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d < time.Millisecond || d > 10*time.Second {
			return badOption("timeout %v: want 1ms to 10s", d)
		}
		o.timeout = d
		return nil
	})
}

// WithLogger sets where the Limiter logs Redis failures that no caller sees (releases that could
// not reach Redis: at most one line per 10 seconds, with the number of failures) and the circuit
// breaker's state changes (opened, with its cause, and closed; not each probe). The default
// discards them. go-redis logs through a logger of its own: see hybrid.NewRedisLog.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) (err error) {
		o.logger, err = option.NonNil(ErrBadOption, "logger", l)
		return err
	})
}
