package limits

import (
	"fmt"
	"math"
	"time"
)

// The bounds of a limit. reconcile.lua and the strict scripts reject anything outside them.
const (
	// MinRate is the smallest rate, in tokens per second: one token per 31.7 years.
	MinRate = 1e-9
	// MaxRate is the largest rate, in tokens per second.
	MaxRate = 1e9
	// MaxBurst is the largest burst of a rate limit.
	MaxBurst = 1_000_000_000
	// MaxLimit is the largest limit of a window (units per period).
	MaxLimit = 1_000_000_000
	// MinPeriod is the shortest period of a window.
	MinPeriod = time.Millisecond
	// MaxPeriod is the longest period of a window, 1e14 µs (about 3.2 years).
	MaxPeriod = 100_000_000_000_000 * time.Microsecond
	// MaxKeyLen is the longest key (a strict subject or tag) any limiter accepts, in bytes.
	MaxKeyLen = 1024
	// MaxKeyPrefixLen is the longest key prefix (WithKeyPrefix) any limiter accepts, in bytes.
	MaxKeyPrefixLen = 64
)

// CheckRate reports why a token bucket of rate tokens per second and burst tokens is out of bounds,
// or nil: rate must be a finite number from MinRate to MaxRate, burst from 1 to MaxBurst. It does
// not allocate when the limit is valid.
func CheckRate(rate float64, burst int64) error {
	switch {
	case math.IsNaN(rate) || math.IsInf(rate, 0) || rate < MinRate || rate > MaxRate:
		return fmt.Errorf("rate %v: want a finite number from %v to %v tokens per second", rate, MinRate, float64(MaxRate))
	case burst < 1 || burst > MaxBurst:
		return fmt.Errorf("burst %d: want 1 to %d", burst, MaxBurst)
	}
	return nil
}

// CheckWindow reports why a limit of limit units per period is out of bounds, or nil: limit from 1
// to MaxLimit, period from MinPeriod to MaxPeriod.
func CheckWindow(limit int64, period time.Duration) error {
	switch {
	case limit < 1 || limit > MaxLimit:
		return fmt.Errorf("limit %d: want 1 to %d", limit, MaxLimit)
	case period < MinPeriod || period > MaxPeriod:
		return fmt.Errorf("period %v: want %v to %v", period, MinPeriod, MaxPeriod)
	}
	return nil
}

// RateOK reports whether a rate and burst are within the bounds CheckRate checks, without building
// an error: for hot paths, which call CheckRate only to explain a refusal.
func RateOK(rate float64, burst int64) bool {
	return rate >= MinRate && rate <= MaxRate && burst >= 1 && burst <= MaxBurst
}
