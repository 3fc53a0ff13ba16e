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
