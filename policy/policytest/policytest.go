// Package policytest builds the [policy.Enforcer], [policy.Policy] and [policy.UpstreamConfig] values that tests of policy's
// users (observe, sidecar, the dashboard, hybridrated) start from, as net/http/httptest does for
// servers: each function fails the test on an error instead of returning it.
package policytest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/policy"
)

// CloseTimeout bounds the Close that [NewEnforcer] runs in the test's cleanup: long enough for the
// final flush on a loaded machine, short enough that a hung Redis does not hang the test.
const CloseTimeout = 5 * time.Second

// NewEnforcer returns policy.NewEnforcer(rdb, opts...), failing tb on an error. The Enforcer is
// closed in tb.Cleanup, within CloseTimeout; rdb stays open.
func NewEnforcer(tb testing.TB, rdb redis.UniversalClient, opts ...policy.Option) *policy.Enforcer {
	tb.Helper()
	enf, err := policy.NewEnforcer(rdb, opts...)
	if err != nil {
		tb.Fatalf("policy.NewEnforcer: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), CloseTimeout)
		defer cancel()
		_ = enf.Close(ctx)
	})
	return enf
}

// Setter is what takes a policy: a *policy.Enforcer, or an observe.Observer in front of one.
type Setter interface {
	SetPolicy(p *policy.Policy) error
}

// SetPolicy parses doc, a policy file named name, sets it on s and returns it, failing tb on an
// error of either.
func SetPolicy(tb testing.TB, s Setter, doc, name string) *policy.Policy {
	tb.Helper()
	p, err := policy.Parse([]byte(doc), name)
	if err != nil {
		tb.Fatalf("policy.Parse %s: %v", name, err)
	}
	if err := s.SetPolicy(p); err != nil {
		tb.Fatalf("SetPolicy %s: %v", name, err)
	}
	return p
}

// Upstream returns the configuration of one upstream (envoyproxy/ratelimit) file, doc named name,
// built with opts; it fails tb on an error of policy.ParseUpstream or policy.NewUpstreamConfig.
func Upstream(tb testing.TB, name, doc string, opts ...policy.UpstreamOption) *policy.UpstreamConfig {
	tb.Helper()
	f, err := policy.ParseUpstream([]byte(doc), name)
	if err != nil {
		tb.Fatalf("policy.ParseUpstream %s: %v", name, err)
	}
	cfg, err := policy.NewUpstreamConfig([]*policy.UpstreamFile{f}, opts...)
	if err != nil {
		tb.Fatalf("policy.NewUpstreamConfig %s: %v", name, err)
	}
	return cfg
}

// HungTimeout is the strict timeout of [HungEnforcer]'s Enforcer.
const HungTimeout = 50 * time.Millisecond

// HungEnforcer starts a redis-server of the test's own and returns it with an Enforcer over a
// client with go-redis's defaults (the deadline of a call is not applied to the socket), for a test
// that stops the server (redistest.Server.Hung): its strict timeout is HungTimeout, then opts apply.
func HungEnforcer(tb testing.TB, opts ...policy.Option) (*redistest.Server, *policy.Enforcer) {
	tb.Helper()
	srv := redistest.Start(tb)
	return srv, NewEnforcer(tb, srv.Client(tb), append([]policy.Option{policy.WithStrictTimeout(HungTimeout)}, opts...)...)
}
