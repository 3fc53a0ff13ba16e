package outcome

import "testing"

func TestStrings(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{DefaultFailure.String(), "default"},
		{LocalFallback.String(), "local-fallback"},
		{FailOpen.String(), "fail-open"},
		{FailClosed.String(), "fail-closed"},
		{FailurePolicy(9).String(), "FailurePolicy(9)"},
		{Source(0).String(), "none"},
		{SourceLocal.String(), "local"},
		{SourceCentral.String(), "central"},
		{SourceDenyCache.String(), "deny-cache"},
		{SourceFallback.String(), "fallback"},
		{SourceStrict.String(), "strict"},
		{SourceMemo.String(), "memo"},
		{Source(99).String(), "none"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestValid(t *testing.T) {
	for p := FailurePolicy(-1); p <= FailClosed+1; p++ {
		if got, want := p.Valid(), p >= DefaultFailure && p <= FailClosed; got != want {
			t.Errorf("%v.Valid() = %v, want %v", p, got, want)
		}
	}
}
