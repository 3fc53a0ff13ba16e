package sidecar

import (
	"errors"
	"maps"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/policy"
)

// ErrBadOption is wrapped by every error of an invalid or nil option, or of a nil Checker, given to
// [New].
var ErrBadOption = errors.New("sidecar: bad option")

func badOption(format string, args ...any) error { return option.Bad(ErrBadOption, format, args...) }

// Option configures a [Server]; see the With functions. Options are immutable values, safe to share
// between goroutines and to pass to several New calls.
type Option interface{ option.Setter[config] }

type optionFunc = option.Func[config]

// WithKeys maps descriptor entry keys to dimension names, beyond the defaults ("remote_address" is
// "ip"; any other key names the dimension of the same name; "tier" sets the tier). An empty key or
// dimension is an error. The map is copied; several WithKeys add up.
func WithKeys(keys map[string]string) Option {
	return optionFunc(func(c *config) error {
		for k, v := range keys {
			if k == "" || v == "" {
				return badOption("keys: empty key or dimension in %q: %q", k, v)
			}
		}
		m := maps.Clone(c.Keys)
		if m == nil {
			m = make(map[string]string, len(keys))
		}
		maps.Copy(m, keys)
		c.Keys = m
		return nil
	})
}

// WithMeterProvider sets the provider that receives the sidecar's own metrics (requests by API and
// code); nil means the default, otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) error {
		c.MeterProvider = mp
		return nil
	})
}

// WithInstance sets the hybridrate.instance attribute. Empty means the default,
// hybrid.DefaultInstance().
func WithInstance(name string) Option {
	return optionFunc(func(c *config) error {
		c.Instance = name
		return nil
	})
}

// WithUpstream makes the Server answer as envoyproxy/ratelimit does (see "Upstream's configuration"
// in the package documentation): cur returns the configuration in force, whose Policy the Checker
// enforces, or nil while none is loaded. The default, as is a nil cur, is the Server's own answers.
func WithUpstream(cur func() *policy.UpstreamConfig) Option {
	return optionFunc(func(c *config) error {
		c.Upstream = cur
		return nil
	})
}

// WithUpstreamShadow is upstream's SHADOW_MODE: the overall code is OK even when a descriptor is
// OVER_LIMIT (the statuses still say which). Only with WithUpstream; off by default.
func WithUpstreamShadow() Option {
	return optionFunc(func(c *config) error {
		c.UpstreamShadow = true
		return nil
	})
}

// WithUpstreamHeaders adds upstream's rate-limit headers (LIMIT_RESPONSE_HEADERS_ENABLED) under
// these names (DefaultHeaderNames are upstream's). Only with WithUpstream; the default, as is nil,
// adds none.
func WithUpstreamHeaders(names *HeaderNames) Option {
	return optionFunc(func(c *config) error {
		if names != nil {
			n := *names
			names = &n
		}
		c.UpstreamHeaders = names
		return nil
	})
}

// WithUpstreamStopIncrement is upstream's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: when a request's
// hits would take some of its limits over, only those limits count them (upstream reads every count
// first, then charges only those). Only with WithUpstream; off by default.
func WithUpstreamStopIncrement() Option {
	return optionFunc(func(c *config) error {
		c.UpstreamStopIncrement = true
		return nil
	})
}

// WithUpstreamStats counts each limit's hits in st as upstream's statistics do (see
// [UpstreamStats]). Only with WithUpstream; the default, as is nil, counts nothing.
func WithUpstreamStats(st *UpstreamStats) Option {
	return optionFunc(func(c *config) error {
		c.UpstreamStats = st
		return nil
	})
}

// WithUpstreamNearLimitRatio is upstream's NEAR_LIMIT_RATIO: the share of a limit, from 0 to 1,
// above which hits count as near_limit in the WithUpstreamStats counts (upstream's default is
// 0.8). The default is 0.
func WithUpstreamNearLimitRatio(r float32) Option {
	return optionFunc(func(c *config) error {
		if !(r >= 0 && r <= 1) {
			return badOption("upstream near-limit ratio %v: want 0 to 1", r)
		}
		c.UpstreamNearLimitRatio = r
		return nil
	})
}

// WithClock sets the clock of duration_until_reset in upstream's answers; nil means time.Now, the
// default.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) error {
		c.Now = now
		return nil
	})
}
