package policy_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/policy"
)

// TestConstructorsRejectBadOptions: NewEnforcer, NewReloader and NewUpstreamConfig refuse a nil
// option, an argument out of its range and a missing required argument with an error wrapping
// ErrBadOption, as every public constructor does (docs/design.md, "Constructors").
func TestConstructorsRejectBadOptions(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // NewEnforcer does no I/O
	t.Cleanup(func() { _ = rdb.Close() })
	for name, opt := range map[string]policy.Option{
		"nil":                nil,
		"empty prefix":       policy.WithKeyPrefix(""),
		"prefix with braces": policy.WithKeyPrefix("a{b}"),
		"zero timeout":       policy.WithStrictTimeout(0),
		"negative lease":     policy.WithWindowLeases(-time.Second),
		"bad dimension":      policy.WithDimensions("ok", "Bad-Name"),
		"nil cost func":      policy.WithCostFuncs(map[string]policy.CostFunc{"x": nil}),
		"zero nodes":         policy.WithFallbackNodes(0),
		"nil logger":         policy.WithLogger(nil),
	} {
		if _, err := policy.NewEnforcer(rdb, opt); !errors.Is(err, policy.ErrBadOption) {
			t.Errorf("NewEnforcer with %s: %v, want an error wrapping ErrBadOption", name, err)
		}
	}
	if _, err := policy.NewEnforcer(nil); !errors.Is(err, policy.ErrBadOption) {
		t.Errorf("NewEnforcer(nil): %v, want an error wrapping ErrBadOption", err)
	}

	path := filepath.Join(t.TempDir(), "p.yaml")
	for name, opt := range map[string]policy.ReloaderOption{
		"nil":            nil,
		"short interval": policy.WithReloadInterval(time.Microsecond),
	} {
		if _, err := policy.NewReloader(path, fakeTarget{}, opt); !errors.Is(err, policy.ErrBadOption) {
			t.Errorf("NewReloader with %s: %v, want an error wrapping ErrBadOption", name, err)
		}
	}

	for name, opt := range map[string]policy.UpstreamOption{
		"nil":               nil,
		"unknown algorithm": policy.WithUpstreamAlgorithm("leaky"),
	} {
		if _, err := policy.NewUpstreamConfig(nil, opt); !errors.Is(err, policy.ErrBadOption) {
			t.Errorf("NewUpstreamConfig with %s: %v, want an error wrapping ErrBadOption", name, err)
		}
	}
	c, err := policy.NewUpstreamConfig(nil, policy.WithUpstreamAlgorithm(""), policy.WithMergeDomains())
	if err != nil || c == nil {
		t.Errorf("NewUpstreamConfig with the default algorithm: %v, %v; want a config, nil", c, err)
	}
}

type fakeTarget struct{}

func (fakeTarget) SetPolicy(*policy.Policy) error { return nil }
