// Package limits holds the bounds of every limit the library accepts, and the one function per kind
// of limit that checks them: [CheckRate] for a token bucket given as a rate and a burst (the hybrid
// limiter), [CheckWindow] for a limit per period (the strict algorithms). The Lua scripts check the
// same bounds again. Callers wrap the returned error in their own error type:
//
//	if err := limits.CheckRate(l.Rate, l.Burst); err != nil {
//		return fmt.Errorf("%w: %w", ErrInvalidLimit, err)
//	}
package limits
