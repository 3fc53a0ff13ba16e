// Package option is the functional-options plumbing of the public packages' constructors
// (docs/design.md, "Constructors"). A package declares its Option as an interface embedding
// [Setter] of its unexported settings struct, so that only [Func] implements it and go doc shows
// "Has unexported methods"; [Apply] runs the options in New, and [Bad] makes their errors.
package option

import "fmt"

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
