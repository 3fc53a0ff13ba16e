package central

import (
	"sync"
	"time"
)

// BreakerConfig configures the circuit breaker in front of Redis.
type BreakerConfig struct {
	// Threshold is the number of consecutive failed calls that opens the breaker; at least 1.
	Threshold int
	// Cooldown is how long the breaker stays open before it lets one probe through; positive.
	Cooldown time.Duration
	// MinSpan is how long a run of consecutive failures must last, from its first failure, before it
	// can open the breaker; 0 opens at the Threshold-th failure. A momentary stall (a GC pause, a
	// starved CPU) makes many concurrent calls time out at once; a span keeps that from switching
	// every key to the failure policy for a whole Cooldown, while an outage still opens it quickly.
	MinSpan time.Duration
}

// BreakerState is the state of a [Breaker].
type BreakerState int

// The breaker states.
const (
	BreakerClosed   BreakerState = iota // calls go to Redis
	BreakerOpen                         // calls fail fast with ErrUnavailable
	BreakerHalfOpen                     // one probe call is in flight; the others fail fast
)

// String returns "closed", "open" or "half-open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return "unknown"
}

// Breaker is a consecutive-failure circuit breaker: Threshold failures in a row, spanning at least
// MinSpan, open it; after Cooldown
// one probe is allowed; the probe's success closes it and its failure opens it again. Safe for
// concurrent use.
type Breaker struct {
	cfg BreakerConfig
	now func() time.Time

	mu       sync.Mutex   // guards the fields below
	state    BreakerState //
	failures int          // consecutive failures while closed
	firstAt  time.Time    // when the current run of failures began
	openedAt time.Time    // when the breaker last opened
	probing  bool         // a half-open probe is in flight
}

// NewBreaker returns a closed breaker. now is the clock (nil means time.Now).
func NewBreaker(cfg BreakerConfig, now func() time.Time) *Breaker {
	if now == nil {
		now = time.Now
	}
	return &Breaker{cfg: cfg, now: now}
}

// Allow reports whether a call may go to Redis now. A true answer must be followed by exactly one
// Success, Failure or Cancel.
func (b *Breaker) Allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true
	case BreakerOpen:
		if b.now().Sub(b.openedAt) < b.cfg.Cooldown {
			return false
		}
		b.state = BreakerHalfOpen
		b.probing = true
		return true
	default: // half-open
		if b.probing {
			return false
		}
		b.probing = true
		return true
	}
}

// Success records a call that Redis answered.
func (b *Breaker) Success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = 0
	b.probing = false
	b.state = BreakerClosed
}

// Failure records a call that Redis did not answer (network error, timeout).
func (b *Breaker) Failure() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	switch b.state {
	case BreakerClosed:
		now := b.now()
		if b.failures == 0 {
			b.firstAt = now
		}
		b.failures++
		if b.failures >= b.cfg.Threshold && now.Sub(b.firstAt) >= b.cfg.MinSpan {
			b.state = BreakerOpen
			b.openedAt = now
		}
	default:
		b.state = BreakerOpen
		b.openedAt = b.now()
	}
}

// Cancel records an allowed call that ended without telling anything about Redis (the caller's
// context was cancelled); a half-open probe slot is released.
func (b *Breaker) Cancel() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
}

// State returns the current state.
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}
