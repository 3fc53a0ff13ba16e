package option

import (
	"errors"
	"testing"
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
