package strict

import (
	"fmt"
	"time"

	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/internal/redisx"
)

// The defaults of [New]. They match the hybrid limiter's (package hybrid) and the policy enforcer's.
const (
	// DefaultKeyPrefix starts every key unless [WithKeyPrefix] says otherwise; it is also the hybrid
	// and concurrency limiters' default prefix (the key layouts do not collide).
	DefaultKeyPrefix = "hr"
	// DefaultTimeout bounds one Redis call unless [WithTimeout] says otherwise.
	DefaultTimeout = 50 * time.Millisecond
	// DefaultBreakerThreshold is the number of consecutive failed calls that opens the circuit
	// breaker unless [WithBreaker] says otherwise.
	DefaultBreakerThreshold = redisx.DefaultBreakerThreshold
	// DefaultBreakerCooldown is how long the breaker stays open before a probe, unless [WithBreaker]
	// says otherwise.
	DefaultBreakerCooldown = redisx.DefaultBreakerCooldown
	// DefaultBreakerMinSpan is how long a run of failures must last to open the breaker, unless
	// [WithBreaker] says otherwise.
	DefaultBreakerMinSpan = redisx.DefaultBreakerMinSpan
)

// An Option configures a [Limiter] in [New]. Options are immutable values, safe to share between
// goroutines and to pass to several New calls.
type Option interface{ option.Setter[options] }

type optionFunc = option.Func[options]

// options are the settings of a Limiter; newOptions holds every default.
type options struct {
	prefix  string
	hash    bool
	hashKey []byte
	timeout time.Duration
	breaker redisx.BreakerConfig
	now     func() time.Time
	// leases and leaseLife: WithWindowLeases.
	leases    bool
	leaseLife time.Duration
}

func newOptions() options {
	return options{
		prefix:  DefaultKeyPrefix,
		timeout: DefaultTimeout,
		breaker: redisx.BreakerConfig{Threshold: DefaultBreakerThreshold, Cooldown: DefaultBreakerCooldown,
			MinSpan: DefaultBreakerMinSpan},
		now: time.Now,
	}
}

// WithKeyPrefix sets the string that starts every key: 1 to 64 bytes with no braces or whitespace.
// The default is DefaultKeyPrefix ("hr").
func WithKeyPrefix(p string) Option {
	return optionFunc(func(o *options) (err error) {
		o.prefix, err = option.KeyPrefix(ErrBadOption, p)
		return err
	})
}

// WithTimeout bounds one Redis call, round trip included; positive. The default is DefaultTimeout
// (50ms). A call that times out returns an error for which [IsTransport] is true. The bound holds
// on a hung Redis whatever the client's options: a *redis.Client (a Sentinel failover client too)
// created without ContextTimeoutEnabled is used through a shallow copy with socket timeouts of d,
// sharing its connection pool; a *redis.ClusterClient created without it, through a new cluster
// client built from its options with ContextTimeoutEnabled and socket timeouts of d, with
// connections of its own, which [Limiter.Close] closes. Neither runs the hooks added to the client
// (AddHook): create the client with ContextTimeoutEnabled: true to keep them, and it is used as is.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d <= 0 {
			return option.Bad(ErrBadOption, "timeout %v: want a positive duration", d)
		}
		o.timeout = d
		return nil
	})
}

// WithHashedSubjects stores subjects and tags in keys as the first 16 bytes of their SHA-256 in hex
// (HMAC-SHA-256 with key, when key is not empty), so no raw API key, e-mail or IP address reaches
// Redis. Without a key, a small space such as IPv4 addresses can be reversed by hashing every
// candidate. By default subjects are stored as given.
func WithHashedSubjects(key []byte) Option {
	return optionFunc(func(o *options) error {
		o.hash = true
		o.hashKey = append([]byte(nil), key...)
		return nil
	})
}

// WithBreaker configures the circuit breaker in front of Redis: threshold (at least 1) consecutive
// failed calls, spanning at least minSpan (0 or more) from the first, open it; after cooldown
// (positive) one probe call goes through, and its success closes it. A refusal (OOM, NOAUTH, …)
// opens it at the threshold whatever the span. The defaults are DefaultBreakerThreshold,
// DefaultBreakerCooldown and DefaultBreakerMinSpan.
func WithBreaker(threshold int, cooldown, minSpan time.Duration) Option {
	return optionFunc(func(o *options) error {
		cfg := o.breaker
		cfg.Threshold, cfg.Cooldown, cfg.MinSpan = threshold, cooldown, minSpan
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrBadOption, err)
		}
		o.breaker = cfg
		return nil
	})
}

// WithClock sets the clock of the breaker, of [Shaper.WaitN]'s deadline arithmetic and of the windows
// of [WithWindowLeases]; nil means time.Now, the default. The scripts' limits run on Redis TIME.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(o *options) error {
		if now == nil {
			now = time.Now
		}
		o.now = now
		return nil
	})
}
