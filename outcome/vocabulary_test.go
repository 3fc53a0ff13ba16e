package outcome_test

import (
	"testing"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/strict"
)

// TestOneErrUnavailable: the packages' ErrUnavailable is one value, so errors.Is with any of them
// recognises every package's "Redis could not serve the call".
func TestOneErrUnavailable(t *testing.T) {
	for _, err := range []error{concurrency.ErrUnavailable, strict.ErrUnavailable, central.ErrUnavailable} {
		if err != hybrid.ErrUnavailable {
			t.Errorf("%v is not hybrid.ErrUnavailable", err)
		}
	}
}
