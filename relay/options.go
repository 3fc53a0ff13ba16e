package relay

import (
	"errors"
	"time"

	"github.com/hybridrate/hybridrate/internal/option"
)

// ErrBadOption is wrapped by every error of an invalid or nil option given to [New].
var ErrBadOption = errors.New("relay: bad option")

func badOption(format string, args ...any) error { return option.Bad(ErrBadOption, format, args...) }

// Option configures a [Relay]; see the With functions. Options are immutable values, safe to share
// between goroutines and to pass to several New calls.
type Option interface{ option.Setter[config] }

type optionFunc = option.Func[config]

// duration is the body of the With functions of a positive duration.
func duration(name string, d time.Duration, set func(*config, time.Duration)) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return badOption("%s %v: want a positive duration", name, d)
		}
		set(c, d)
		return nil
	})
}

// WithInterval sets how often Run calls Tick. The default is DefaultInterval (20ms).
func WithInterval(d time.Duration) Option {
	return duration("interval", d, func(c *config, d time.Duration) { c.Interval = d })
}

// WithHorizon sets how long the pool of a key should last at its children's demand. The default is
// DefaultHorizon (4s).
func WithHorizon(d time.Duration) Option {
	return duration("horizon", d, func(c *config, d time.Duration) { c.Horizon = d })
}

// WithLeaseLife sets how long tokens Redis leased to the relay may wait in its pool; what is left
// then is written off, as a node writes off an expired lease. The default is DefaultLeaseLife (8s).
func WithLeaseLife(d time.Duration) Option {
	return duration("lease life", d, func(c *config, d time.Duration) { c.LeaseLife = d })
}

// WithActiveWindow sets how long after a child's last call its declared demand counts, and how long
// a key with no calls is kept. The default is DefaultActiveWindow (16s).
func WithActiveWindow(d time.Duration) Option {
	return duration("active window", d, func(c *config, d time.Duration) { c.ActiveWindow = d })
}

// WithFleetBeat sets how often Run registers the relay in the fleet registry and reads its count.
// The default is DefaultFleetBeat (5s).
func WithFleetBeat(d time.Duration) Option {
	return duration("fleet beat", d, func(c *config, d time.Duration) { c.FleetBeat = d })
}

// WithAdvance sets the advance the relay lends its children, from 0 to an hour: their shares are
// of Burst plus what a key under its rate may be lent of the coming refill over d, as
// reconcile.lua's. It may not exceed the Advance of the central.Config given to New (what Redis
// lends the relay; ClientConfig's is DefaultAdvance): New refuses a larger one. Without it, the
// relay lends its children none (0) and keeps the advance Redis lends it in its own pool, which
// costs Redis fewer calls (docs/benchmarks.md, "Any fleet size").
func WithAdvance(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 0 || d > time.Hour {
			return badOption("advance %v: want 0 to an hour", d)
		}
		c.Advance = d
		return nil
	})
}

// WithFleet sets the function that returns the number of limiters behind all relays of the prefix
// (0 when unknown): a child whose share of a key rounds below a token gets one only while fleet()
// is at most the key's Burst plus its advance (reconcile.lua's floor rule). The default, as is nil,
// is [Relay.FleetSize]: the fleet registry's count, which the children join (they heartbeat to
// Redis as any limiter does) and Run reads every fleet beat.
func WithFleet(fleet func() int64) Option {
	return optionFunc(func(c *config) error {
		c.Fleet = fleet
		return nil
	})
}

// WithMaxKeys bounds the keys held, at least 1. The default is DefaultMaxKeys.
func WithMaxKeys(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return badOption("max keys %d: want at least 1", n)
		}
		c.MaxKeys = n
		return nil
	})
}

// WithColdCredit admits the first one-off take of a key the relay has not seen (or dropped after
// the active window without calls) without asking Redis, if it asks for at most n tokens and the
// key's bucket refills within the active window (Rate·ActiveWindow ≥ Burst); the admission is
// reported in the next round, batched with other keys. Set it only where the relay is the one way
// to Redis for its keys (children that shard keys over relays, Sharded): then a key the relay does
// not know has had no consumption for the active window, and its bucket is full, unless its owner
// changed. Each such admission is a cold-start credit of docs/accuracy.md's bound. Only a take
// whose child vetted the key against a complete copy of the ban list (central.Update.Vetted, which
// package hybrid sets) gets it: Redis reads a key's ban on its first contact, and a relay that
// answered without Redis would let a banned key through. n must not be negative; the default, 0,
// sends a new key's first takes to Redis.
func WithColdCredit(n int64) Option {
	return optionFunc(func(c *config) error {
		if n < 0 {
			return badOption("cold credit %d: want 0 or more", n)
		}
		c.ColdCredit = n
		return nil
	})
}

// WithClock sets the relay's clock: a function returning the time on a monotonic clock in
// nanoseconds. nil means the real clock, the default.
func WithClock(now func() int64) Option {
	return optionFunc(func(c *config) error {
		c.Now = now
		return nil
	})
}
