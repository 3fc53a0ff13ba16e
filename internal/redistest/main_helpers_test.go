package redistest

import (
	"testing"
	"time"
)

// recordTB counts the errors reported to it instead of failing the test.
type recordTB struct {
	testing.TB
	errs int
}

func (r *recordTB) Helper()               {}
func (r *recordTB) Logf(string, ...any)   {}
func (r *recordTB) Errorf(string, ...any) { r.errs++ }

func TestTimedReportsOnlyCallsAtOrPastTheBound(t *testing.T) {
	t.Parallel()
	r := &recordTB{TB: t}
	ran := false
	if took := Timed(r, "fast", time.Hour, func() { ran = true }); took < 0 || took >= time.Hour {
		t.Errorf("Timed returned %v", took)
	}
	if !ran || r.errs != 0 {
		t.Fatalf("a call within the bound: ran %v, %d errors; want true, 0", ran, r.errs)
	}
	Timed(r, "slow", 0, func() {}) // any call takes at least a zero bound
	if r.errs != 1 {
		t.Errorf("a call at the bound: %d errors, want 1", r.errs)
	}
}
