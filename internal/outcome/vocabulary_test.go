package outcome_test

import (
	"testing"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/strict"
)

// TestOneVocabulary: the packages' failure policies, sources and ErrUnavailable are one type and one
// value each, so a value from one package means the same in every other.
func TestOneVocabulary(t *testing.T) {
	var fp hybrid.FailurePolicy = concurrency.FailClosed // compiles only if the types are one
	if fp != hybrid.FailClosed || concurrency.LocalFallback != hybrid.LocalFallback ||
		concurrency.FailOpen != hybrid.FailOpen || concurrency.DefaultFailure != hybrid.DefaultFailure {
		t.Error("hybrid's and concurrency's failure policies differ")
	}
	var src hybrid.Source = policy.SourceStrict // compiles only if policy.Source is hybrid.Source
	if src.String() != "strict" || concurrency.SourceCentral != hybrid.SourceCentral ||
		concurrency.SourceFallback != hybrid.SourceFallback {
		t.Error("the packages' sources differ")
	}
	for _, err := range []error{concurrency.ErrUnavailable, strict.ErrUnavailable, central.ErrUnavailable} {
		if err != hybrid.ErrUnavailable {
			t.Errorf("%v is not hybrid.ErrUnavailable", err)
		}
	}
}
