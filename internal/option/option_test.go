package option

import (
	"errors"
	"strings"
	"testing"

	"github.com/hybridrate/hybridrate/outcome"
)

type settings struct{ trail []int }

type opt interface{ Setter[settings] }

func with(n int) opt {
	return Func[settings](func(s *settings) error {
		if n < 0 {
			return Bad(errBad, "n %d: want at least 0", n)
		}
		s.trail = append(s.trail, n)
		return nil
	})
}

var errBad = errors.New("test: bad option")

// TestApply: options run in order; the first error (an option's own, or a nil option's) stops the
// rest and wraps the package's sentinel.
func TestApply(t *testing.T) {
	var s settings
	if err := Apply(&s, errBad, []opt{with(1), with(2), with(3)}); err != nil || len(s.trail) != 3 || s.trail[2] != 3 {
		t.Fatalf("Apply = %v, trail %v; want nil, [1 2 3]", err, s.trail)
	}
	for name, opts := range map[string][]opt{
		"nil option":   {with(1), nil, with(2)},
		"option error": {with(1), with(-1), with(2)},
	} {
		s = settings{}
		err := Apply(&s, errBad, opts)
		if !errors.Is(err, errBad) {
			t.Errorf("%s: Apply = %v, want an error wrapping %v", name, err, errBad)
		}
		if len(s.trail) != 1 {
			t.Errorf("%s: trail %v: want [1], nothing applied after the error", name, s.trail)
		}
	}
	if got := Bad(errBad, "x %d", 7).Error(); got != "test: bad option: x 7" {
		t.Errorf("Bad = %q", got)
	}
}

// TestKeyPrefixAndFailurePolicy: the shared checks of WithKeyPrefix and WithFailurePolicy accept
// what every package accepts, map DefaultFailure to LocalFallback, and wrap the package's sentinel.
func TestKeyPrefixAndFailurePolicy(t *testing.T) {
	if p, err := KeyPrefix(errBad, "hr"); p != "hr" || err != nil {
		t.Errorf(`KeyPrefix("hr") = %q, %v; want "hr", nil`, p, err)
	}
	for _, p := range []string{"", "a{b", "a}b", "a b", strings.Repeat("x", 65)} {
		if _, err := KeyPrefix(errBad, p); !errors.Is(err, errBad) {
			t.Errorf("KeyPrefix(%q) = %v, want an error wrapping %v", p, err, errBad)
		}
	}
	for in, want := range map[outcome.FailurePolicy]outcome.FailurePolicy{
		outcome.DefaultFailure: outcome.LocalFallback,
		outcome.LocalFallback:  outcome.LocalFallback,
		outcome.FailOpen:       outcome.FailOpen,
		outcome.FailClosed:     outcome.FailClosed,
	} {
		if got, err := FailurePolicy(errBad, in); got != want || err != nil {
			t.Errorf("FailurePolicy(%v) = %v, %v; want %v, nil", in, got, err, want)
		}
	}
	for _, in := range []outcome.FailurePolicy{-1, outcome.FailClosed + 1} {
		if _, err := FailurePolicy(errBad, in); !errors.Is(err, errBad) {
			t.Errorf("FailurePolicy(%d) = %v, want an error wrapping %v", in, err, errBad)
		}
	}
}

// TestNonNil: a nil pointer is an error wrapping the sentinel and naming the argument.
func TestNonNil(t *testing.T) {
	n := 1
	if p, err := NonNil(errBad, "n", &n); p != &n || err != nil {
		t.Errorf("NonNil(&n) = %v, %v; want &n, nil", p, err)
	}
	if _, err := NonNil[int](errBad, "n", nil); !errors.Is(err, errBad) || err.Error() != "test: bad option: nil n" {
		t.Errorf("NonNil(nil) = %v, want %q", err, "test: bad option: nil n")
	}
}
