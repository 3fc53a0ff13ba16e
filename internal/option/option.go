// Package option is the functional-options plumbing of the public packages' constructors
// (docs/design.md, "Constructors"). A package declares its Option as an interface embedding
// [Setter] of its unexported settings struct, so that only [Func] implements it and go doc shows
// "Has unexported methods"; [Apply] runs the options in New, and [Bad] makes their errors.
package option

import (
	"fmt"

	"github.com/hybridrate/hybridrate/internal/limits"
	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/outcome"
)

// Setter is one setting of a T. Its method is unexported: [Func] is its only implementation.
type Setter[T any] interface{ set(*T) error }

// Func adapts a function to a [Setter]: the body of every With function.
type Func[T any] func(*T) error

func (f Func[T]) set(o *T) error { return f(o) }

// Apply applies opts to o in order and returns the first error: an option's own, or, for a nil
// option, an error wrapping bad (the package's ErrBadOption).
func Apply[T any, O Setter[T]](o *T, bad error, opts []O) error {
	for _, opt := range opts {
		if any(opt) == nil {
			return fmt.Errorf("%w: nil option", bad)
		}
		if err := opt.set(o); err != nil {
			return err
		}
	}
	return nil
}

// Bad returns an option error: bad (the package's ErrBadOption) wrapped with a formatted message.
func Bad(bad error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{bad}, args...)...)
}

// KeyPrefix checks the argument of a package's WithKeyPrefix: 1 to limits.MaxKeyPrefixLen bytes
// with no braces or whitespace (redisx.ValidPrefix). It returns p, or an error wrapping bad.
func KeyPrefix(bad error, p string) (string, error) {
	if !redisx.ValidPrefix(p) {
		return "", Bad(bad, "key prefix %q: want 1 to %d bytes without braces or whitespace", p, limits.MaxKeyPrefixLen)
	}
	return p, nil
}

// FailurePolicy checks the argument of a package's WithFailurePolicy and returns the policy it
// selects: p, or outcome.LocalFallback (every limiter's default) for outcome.DefaultFailure. An
// unknown policy is an error wrapping bad.
func FailurePolicy(bad error, p outcome.FailurePolicy) (outcome.FailurePolicy, error) {
	if !p.Valid() {
		return outcome.DefaultFailure, Bad(bad, "unknown failure policy %d", int(p))
	}
	if p == outcome.DefaultFailure {
		return outcome.LocalFallback, nil
	}
	return p, nil
}

// NonNil checks a pointer argument that has no nil meaning (a With function's logger): it returns
// p, or, for nil, an error wrapping bad that names what.
func NonNil[P any](bad error, what string, p *P) (*P, error) {
	if p == nil {
		return nil, Bad(bad, "nil %s", what)
	}
	return p, nil
}
