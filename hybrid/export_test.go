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
