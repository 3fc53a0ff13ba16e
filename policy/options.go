package policy

import (
	"errors"
	"log/slog"
	"maps"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/option"
)

// ErrBadOption is wrapped by every error of an invalid or nil option, and of a missing required
// argument, given to [NewEnforcer], [NewReloader] or [NewUpstreamConfig].
var ErrBadOption = errors.New("policy: bad option")

func badOption(format string, args ...any) error { return option.Bad(ErrBadOption, format, args...) }

// Option configures an [Enforcer]; see the With functions that return one. Options are immutable
// values, safe to share between goroutines and to pass to several NewEnforcer calls.
type Option interface{ option.Setter[config] }

type optionFunc = option.Func[config]

// WithKeyPrefix sets the prefix of every Redis key of hybrid and strict rules: what
// hybrid.WithKeyPrefix and strict.WithKeyPrefix accept (1 to 64 bytes with no braces or
// whitespace). The default is hybrid.DefaultKeyPrefix ("hr").
func WithKeyPrefix(p string) Option {
	return optionFunc(func(c *config) (err error) {
		c.KeyPrefix, err = option.KeyPrefix(ErrBadOption, p)
		return err
	})
}

// WithHybridOptions sets the options for hybrid.New, which makes the hybrid rules' limiter (one per
// Enforcer, created when a policy first needs it); they come before the Enforcer's own WithLogger
// and WithKeyPrefix, and hybrid.New checks them. Each rule carries its failure policy in its limits
// (hybrid.Limit.OnFailure), so hybrid.WithFailurePolicy here has no effect on rules. On miniredis,
// pass hybrid.WithCheckTimeout(time.Second): its Lua is slow. The default is none; a later
// WithHybridOptions replaces an earlier one.
func WithHybridOptions(opts ...hybrid.Option) Option {
	return optionFunc(func(c *config) error {
		c.HybridOptions = append([]hybrid.Option(nil), opts...)
		return nil
	})
}

// WithStrictTimeout bounds one strict Redis call; a call that times out is answered by each rule's
// failure policy. It must be positive. The default is DefaultStrictTimeout (50ms).
func WithStrictTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return badOption("strict timeout %v: want a positive duration", d)
		}
		c.StrictTimeout = d
		return nil
	})
}

// WithWindowLeases counts UpstreamWindow rules as envoyproxy/ratelimit counts them, in a string key
// per window charged with INCRBY, instead of strict.lua, and with life > 0 serves them local-first
// from leases of the window's quota (strict.WithWindowLeases, docs/sidecar.md, "Local-first
// windows"): life is how long a lease should last at the key's demand while active (the lease is that
// demand times life, at most 1/strict.WindowLeaseShare of the window's remaining quota; pauses
// between uses do not count as demand time, and leases are renewed ahead in the background, due
// keys in one pipeline: strict.WithWindowLeases); life 0 takes no lease,
// one INCRBY per check. life must not be negative. Windows are then decided by the Enforcer's clock
// (WithClock), as upstream decides them. A request that checks UpstreamWindow rules together with
// rules of other strict algorithms is then an error: a policy whose requests each select one rule
// (Policy.Select, as NewUpstreamConfig compiles) never makes one. The default is off.
func WithWindowLeases(life time.Duration) Option {
	return optionFunc(func(c *config) error {
		if life < 0 {
			return badOption("window lease life %v: want 0 or more", life)
		}
		c.WindowLeases, c.WindowLeaseLife = true, life
		return nil
	})
}

// WithHashKey keys an HMAC-SHA-256 of every subject (the dimension values of a request), so no raw
// API key, user id, e-mail or IP address reaches Redis: keys hold the first 16 bytes of the MAC, in
// hex. Changing the key starts every counter afresh. The key is copied; an empty key hashes
// nothing, which is the default.
func WithHashKey(key []byte) Option {
	return optionFunc(func(c *config) error {
		c.HashKey = append([]byte(nil), key...)
		return nil
	})
}

// WithDimensions declares dimensions beyond the built-in ones (names of 1 to 32 bytes of [a-z0-9_]
// starting with a letter), for package middleware's WithDimension or a Go caller's Request. The
// default is none; several WithDimensions add up.
func WithDimensions(names ...string) Option {
	return optionFunc(func(c *config) error {
		for _, d := range names {
			if !validDimName(d) {
				return badOption("dimension %q: want 1 to 32 bytes of [a-z0-9_], starting with a letter", d)
			}
		}
		c.Dimensions = append(c.Dimensions[:len(c.Dimensions):len(c.Dimensions)], names...)
		return nil
	})
}

// WithCostFuncs adds the cost functions a policy file may name (`cost: {func: name}`), by name; a
// nil function is an error. The map is copied. The default is none; several WithCostFuncs add up,
// a later function replacing an earlier one of the same name.
func WithCostFuncs(funcs map[string]CostFunc) Option {
	return optionFunc(func(c *config) error {
		for name, f := range funcs {
			if f == nil {
				return badOption("cost function %q is nil", name)
			}
		}
		m := maps.Clone(c.CostFuncs)
		if m == nil {
			m = make(map[string]CostFunc, len(funcs))
		}
		maps.Copy(m, funcs)
		c.CostFuncs = m
		return nil
	})
}

// WithOnShadowDeny sets a function called for each would-be denial of a rule in shadow mode (or of
// any rule while the policy is in shadow mode), on the request's goroutine: keep it fast. nil, the
// default, calls nothing.
func WithOnShadowDeny(f func(ShadowEvent)) Option {
	return optionFunc(func(c *config) error {
		c.OnShadowDeny = f
		return nil
	})
}

// WithFallbackNodes sets the number of processes that share a strict rule's limit while Redis is
// away: under outcome.LocalFallback each process enforces Limit/n locally. n must be at least 1; the
// default is 1. (Hybrid rules use the node count the limiter last saw.)
func WithFallbackNodes(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return badOption("fallback nodes %d: want at least 1", n)
		}
		c.FallbackNodes = n
		return nil
	})
}

// WithMaxMemo bounds the denials remembered until their retry-after (see docs/policies.md,
// "Hierarchy"); a negative n disables the memo, 0 keeps the default, DefaultMaxMemo (65536).
func WithMaxMemo(n int) Option {
	return optionFunc(func(c *config) error {
		c.MaxMemo = n
		return nil
	})
}

// WithClock sets the clock of the memo, of local fallbacks and of the windows of WithWindowLeases;
// nil means time.Now, the default. The other limits run on Redis TIME.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) error {
		c.Now = now
		return nil
	})
}

// WithLogger sets where background errors of the hybrid limiters are logged. The default discards
// them.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) (err error) {
		c.Logger, err = option.NonNil(ErrBadOption, "logger", l)
		return err
	})
}

// ReloaderOption configures a [Reloader]; see WithReloadInterval, WithOnReload and
// WithOnReloadError. Options are immutable values, safe to share and to pass to several
// NewReloader calls.
type ReloaderOption interface{ option.Setter[reloaderConfig] }

// WithReloadInterval sets how often Reloader.Run reads the file, at least 1ms. The default is
// DefaultReloadInterval (1s).
func WithReloadInterval(d time.Duration) ReloaderOption {
	return option.Func[reloaderConfig](func(c *reloaderConfig) error {
		if d < time.Millisecond {
			return badOption("reload interval %v: want at least 1ms", d)
		}
		c.Interval = d
		return nil
	})
}

// WithOnReload sets a function called after a changed file has been put in force. nil, the
// default, calls nothing.
func WithOnReload(f func(p *Policy)) ReloaderOption {
	return option.Func[reloaderConfig](func(c *reloaderConfig) error {
		c.OnReload = f
		return nil
	})
}

// WithOnReloadError sets a function called when a changed file cannot be read, parsed or put in
// force (the error names the file and line); the previous policy stays in force. It is called once
// per distinct content of the file, not at every look. nil, the default, calls nothing.
func WithOnReloadError(f func(err error)) ReloaderOption {
	return option.Func[reloaderConfig](func(c *reloaderConfig) error {
		c.OnError = f
		return nil
	})
}

// UpstreamOption configures [NewUpstreamConfig]; see WithMergeDomains and WithUpstreamAlgorithm.
// Options are immutable values, safe to share.
type UpstreamOption interface {
	option.Setter[upstreamSettings]
}

// WithMergeDomains merges files of the same domain into one tree (upstream's MERGE_DOMAIN_CONFIG);
// without it, a domain given twice is an error.
func WithMergeDomains() UpstreamOption {
	return option.Func[upstreamSettings](func(s *upstreamSettings) error {
		s.MergeDomains = true
		return nil
	})
}

// WithUpstreamAlgorithm sets the algorithm that counts every limit. The default (as is the empty
// Algorithm) is UpstreamWindow, upstream's windows aligned to the Unix epoch, counting refused hits
// as upstream does, which give upstream's answers; Hybrid (or another algorithm) is an opt-in. An
// unknown algorithm is an error wrapping ErrBadOption.
func WithUpstreamAlgorithm(a Algorithm) UpstreamOption {
	return option.Func[upstreamSettings](func(s *upstreamSettings) error {
		if a != "" && !a.valid() {
			return badOption("algorithm %q: want hybrid, token_bucket, gcra, fixed_window, sliding_window, sliding_log or upstream_window", a)
		}
		s.Algorithm = a
		return nil
	})
}
