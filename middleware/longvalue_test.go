package middleware_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/hybridrate/hybridrate/middleware"
	"github.com/hybridrate/hybridrate/policy"
)

// TestLongHeaderValuesAreLimited: a 300-byte API key header counted as missing and, under
// missing_key: skip, escaped its rule (issue 23). Every length is now limited alike.
func TestLongHeaderValuesAreLimited(t *testing.T) {
	t.Parallel()
	p := &policy.Policy{MissingKey: policy.MissingSkip, Rules: []policy.Rule{
		{ID: "per-key", Dimensions: []string{"api_key"}, Rate: 0.001, Burst: 4}}}
	s := newStack(t, nil, p, middleware.WithAPIKeyHeader("X-API-Key"))
	for _, n := range []int{250, 257, 300, 8 << 10} {
		key := strings.Repeat("k", n-1) + string(rune('a'+n%26))
		var ws []*httptest.ResponseRecorder
		for i := 0; i < 6; i++ {
			ws = append(ws, s.get(t, "203.0.113.9:4000", "X-API-Key", key))
		}
		assert.Equal(t, []int{200, 200, 200, 200, 429, 429}, codes(ws...), "%d bytes", n)
	}
}
