package policy

import (
	"context"
	"fmt"

	"github.com/hybridrate/hybridrate/strict"
)

// This file holds every call the Enforcer makes to the strict rules' Redis client (strict.Limiter):
// its creation, the one script call of a request, and its health.

// StrictHealth is a snapshot of the strict rules' Redis client. The zero StrictHealth reports no
// calls and an empty Breaker. It is a plain value, safe to copy; not modified by the package once
// returned, so safe to read from several goroutines.
type StrictHealth struct {
	Calls    int64  // script calls sent
	Errors   int64  // calls that failed (network, timeout, error reply)
	Rejected int64  // calls not sent because the circuit breaker was open
	Breaker  string // the circuit breaker's state: "closed", "open" or "half-open"
	// LeaseHits counts the checks of UpstreamWindow rules served from a window lease, without Redis
	// (WithWindowLeases).
	LeaseHits int64
}

// StrictHealth returns the state of the strict rules' Redis client.
func (e *Enforcer) StrictHealth() StrictHealth {
	st := e.strict.Stats()
	return StrictHealth{Calls: st.Calls, Errors: st.Errors, Rejected: st.Rejected,
		Breaker: e.strict.BreakerState().String(), LeaseHits: st.LeaseHits}
}

// newStrictClient returns the strict rules' client for a validated cfg, with strict's default breaker
// (the defaults of every package's breaker). It does no I/O.
func newStrictClient(cfg *config) (*strict.Limiter, error) {
	opts := []strict.Option{
		strict.WithKeyPrefix(cfg.KeyPrefix),
		strict.WithTimeout(cfg.StrictTimeout),
		strict.WithClock(cfg.Now),
	}
	if cfg.WindowLeases {
		opts = append(opts, strict.WithWindowLeases(cfg.WindowLeaseLife))
	}
	s, err := strict.New(cfg.Redis, opts...)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return s, nil
}

// closeStrict closes the strict rules' client: it releases the cluster client strict.New may have
// built for itself, never the Enforcer's Redis client.
func (e *Enforcer) closeStrict() { _ = e.strict.Close() }

// allowStrict runs checks, the strict counters of one request under hash tag tag, in one atomic
// script call: every one counts, or none does.
func (e *Enforcer) allowStrict(ctx context.Context, tag string, checks []strict.Check) (strict.MultiResult, error) {
	return e.strict.AllowMulti(ctx, tag, checks)
}

// strictUnavailable reports whether err, from allowStrict, says Redis is not serving (a transport
// error, a refusal, the breaker open): the failure policies answer then.
func strictUnavailable(err error) bool { return strict.IsTransport(err) }
