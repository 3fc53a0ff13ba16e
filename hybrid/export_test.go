package hybrid

import "time"

// WithEvictionCheckInterval sets how often the limiter reads Redis's maxmemory-policy (1 minute by
// default); for tests only.
func WithEvictionCheckInterval(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		o.evictionCheck = d
		return nil
	})
}

// WithBanRefresh sets how often the ban change log is read (10s by default); for tests only.
func WithBanRefresh(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		o.banRefresh = d
		return nil
	})
}

// WithMaxBans sets how many bans the limiter holds locally (65,536 by default); for tests only.
func WithMaxBans(n int) Option {
	return optionFunc(func(o *options) error {
		o.maxBans = n
		return nil
	})
}

// WithTestClock drives every clock of the limiter from now, for tests that must not sleep: the wall
// clock of WithClock (deny-cache deadlines, the outcome.LocalFallback limiter) and the node's monotonic clock
// (lease life, retry times, the trust in Redis's last answer), which counts from now's value at New.
// The global buckets keep Redis TIME: pin it too (miniredis's SetTime) for a deterministic scenario.
func WithTestClock(now func() time.Time) Option {
	return optionFunc(func(o *options) error {
		origin := now()
		o.now = now
		o.mono = func() int64 { return max(int64(now().Sub(origin)), 0) + 1 }
		return nil
	})
}

// WithFleetBeat sets the fleet registry's heartbeat period (5s by default); for tests only.
func WithFleetBeat(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		o.fleetBeat = d
		return nil
	})
}

// SetClock replaces the clock of a RedisLog; for tests only.
func (r *RedisLog) SetClock(now func() time.Time) { r.now = now }

// Unused returns the unused lease this node holds for key, in tokens (0 for a key it does not
// hold); for tests only.
func (l *Limiter) Unused(key string) int64 {
	if e := l.store.Lookup(key, l.store.Hash(key)); e != nil {
		return e.Unused()
	}
	return 0
}

// Splits returns how many of l's keys had their local allowance split per core (local.Stats.Splits);
// for tests only.
func Splits(l *Limiter) int64 { return l.store.Stats().Splits.Load() }

// SplitKey splits key's local allowance per core now, as contention would (local.Store.Split), and
// reports whether it did; for tests only.
func SplitKey(l *Limiter, key string) bool {
	e := l.store.Lookup(key, l.store.Hash(key))
	return e != nil && l.store.Split(e)
}
