package redisx

import (
	"fmt"
	"sync"
	"time"
)

// The breaker's defaults, one place for every package: DefaultBreakerThreshold consecutive failed
// calls, the first at least DefaultBreakerMinSpan before the last, open it for DefaultBreakerCooldown.
const (
	DefaultBreakerThreshold = 5
	DefaultBreakerCooldown  = 500 * time.Millisecond
	DefaultBreakerMinSpan   = 50 * time.Millisecond
)

// DefaultBreaker is a BreakerConfig with the defaults and no callback.
func DefaultBreaker() BreakerConfig {
	return BreakerConfig{Threshold: DefaultBreakerThreshold, Cooldown: DefaultBreakerCooldown, MinSpan: DefaultBreakerMinSpan}
}

// BreakerConfig configures the circuit breaker in front of Redis.
type BreakerConfig struct {
	// Threshold is the number of consecutive failed calls that opens the breaker; at least 1.
	Threshold int
	// Cooldown is how long the breaker stays open before it lets one probe through; positive.
	Cooldown time.Duration
	// MinSpan is how long a run of consecutive failures must last, from its first failure, before it
	// can open the breaker; 0 opens at the Threshold-th failure. A failure whose error Redis refused
	// the call with (ClassRefused, reported with Fail) opens it at the Threshold-th failure whatever
	// the span. A momentary stall (a GC pause, a
	// starved CPU) makes many concurrent calls time out at once; a span keeps that from switching
	// every key to the failure policy for a whole Cooldown, while an outage still opens it quickly.
	MinSpan time.Duration
	// OnStateChange, if not nil, is called after every change of state, outside the breaker's lock,
	// one call at a time and in the order of the changes. It must not call the breaker's Success,
	// Failure, Fail or Cancel (it may call State), and should return quickly: the call that caused
	// the change waits for it.
	OnStateChange func(BreakerEvent)
}

// Validate reports why c cannot configure a breaker, or nil: Threshold must be at least 1, Cooldown
// positive and MinSpan 0 or more.
func (c BreakerConfig) Validate() error {
	if c.Threshold < 1 || c.Cooldown <= 0 || c.MinSpan < 0 {
		return fmt.Errorf("breaker threshold %d, cooldown %v, min span %v: want a threshold of at least 1, a positive cooldown and a min span of 0 or more",
			c.Threshold, c.Cooldown, c.MinSpan)
	}
	return nil
}

// BreakerEvent is a change of a [Breaker]'s state.
type BreakerEvent struct {
	From, To BreakerState
	// Err is the failure that opened the breaker, when To is BreakerOpen and the failure was
	// reported with [Breaker.Fail]; nil otherwise. Class(Err) says what kind of failure it was.
	Err error
	// Failures is the number of consecutive failures that opened the breaker (1 for a failed probe).
	Failures int
	// At is when the change happened, on the breaker's clock.
	At time.Time
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

	notify sync.Mutex // held while OnStateChange runs, taken before mu is released: keeps events in order

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
	switch b.state {
	case BreakerClosed:
		b.mu.Unlock()
		return true
	case BreakerOpen:
		now := b.now()
		if now.Sub(b.openedAt) < b.cfg.Cooldown {
			b.mu.Unlock()
			return false
		}
		b.state = BreakerHalfOpen
		b.probing = true
		b.unlockNotify(BreakerEvent{From: BreakerOpen, To: BreakerHalfOpen, At: now})
		return true
	default: // half-open
		ok := !b.probing
		b.probing = true
		b.mu.Unlock()
		return ok
	}
}

// unlockNotify releases mu and, when ev is a change, delivers it to OnStateChange in order.
func (b *Breaker) unlockNotify(ev BreakerEvent) {
	if ev.From == ev.To || b.cfg.OnStateChange == nil {
		b.mu.Unlock()
		return
	}
	b.notify.Lock()
	b.mu.Unlock()
	defer b.notify.Unlock()
	b.cfg.OnStateChange(ev)
}

// Success records a call that Redis answered.
func (b *Breaker) Success() {
	b.mu.Lock()
	ev := BreakerEvent{From: b.state, To: BreakerClosed}
	if ev.From != BreakerClosed {
		ev.At = b.now()
	}
	b.failures = 0
	b.probing = false
	b.state = BreakerClosed
	b.unlockNotify(ev)
}

// Failure records a call that Redis did not serve (network error, timeout, a refusal); it is
// Fail(nil).
func (b *Breaker) Failure() { b.Fail(nil) }

// Fail records a call that Redis did not serve, with its error, which OnStateChange receives if this
// failure opens the breaker.
func (b *Breaker) Fail(err error) {
	b.mu.Lock()
	b.probing = false
	now := b.now()
	ev := BreakerEvent{From: b.state, To: b.state, Err: err, At: now}
	switch b.state {
	case BreakerClosed:
		if b.failures == 0 {
			b.firstAt = now
		}
		b.failures++
		// A refusal (OOM, WRONGPASS, …) is Redis's answer, not a stall: it need not last MinSpan.
		if b.failures >= b.cfg.Threshold && (now.Sub(b.firstAt) >= b.cfg.MinSpan || Class(err) == ClassRefused) {
			b.state = BreakerOpen
			b.openedAt = now
			ev.Failures = b.failures
		}
	default:
		b.state = BreakerOpen
		b.openedAt = now
		ev.Failures = 1
	}
	ev.To = b.state
	b.unlockNotify(ev)
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
