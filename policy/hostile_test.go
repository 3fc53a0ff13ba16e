package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/hybridrate/hybridrate/policy"
)

// TestNoValueTakesARequestOutOfItsRule is issue 23's first defect: a value longer than MaxValueLen
// counted as missing, so under missing_key: skip a 300-byte api_key escaped a rule that denied a
// 250-byte one after 4. Every value, whatever its length or bytes, is now limited like any other.
func TestNoValueTakesARequestOutOfItsRule(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 300)
	values := map[string]string{
		"250 bytes":                     strings.Repeat("k", 250),
		"256 bytes":                     strings.Repeat("k", policy.MaxValueLen),
		"257 bytes":                     strings.Repeat("k", policy.MaxValueLen+1),
		"300 bytes":                     long,
		"300 bytes, another last byte":  long[:299] + "x", // same first 256 bytes: its own subject
		"1 MB":                          strings.Repeat("m", 1<<20),
		"NUL bytes":                     "a\x00b\x00",
		"invalid UTF-8":                 "\xff\xfe\xc3",
		"long with NUL and invalid UTF": strings.Repeat("\x00\xff", 200),
	}
	for _, algo := range []policy.Algorithm{policy.Hybrid, policy.GCRA, policy.FixedWindow} {
		t.Run(string(algo), func(t *testing.T) {
			t.Parallel()
			rule := policy.Rule{ID: "per-key", Algorithm: algo, Dimensions: []string{"api_key"}, Limit: 4, Period: time.Hour}
			p := &policy.Policy{MissingKey: policy.MissingSkip, StrictTag: "", Rules: []policy.Rule{rule}}
			e := newEnv(t, policy.Config{}, p)
			for name, v := range values {
				var got []bool
				for i := 0; i < 6; i++ {
					got = append(got, e.check(t, req("GET", "/", "api_key", v)).Allowed)
				}
				assert.Equal(t, []bool{true, true, true, true, false, false}, got, "%s: limited like any value", name)
			}
			assert.Equal(t, int64(5*6), e.enf.Stats().LongValues.Load(), "the five long values, at every request")
		})
	}
	t.Run("strict tag", func(t *testing.T) {
		t.Parallel()
		p := &policy.Policy{MissingKey: policy.MissingSkip, StrictTag: "tenant", Rules: []policy.Rule{
			{ID: "per-tenant", Algorithm: policy.GCRA, Dimensions: []string{"tenant"}, Limit: 2, Period: time.Hour}}}
		e := newEnv(t, policy.Config{HashKey: []byte("k")}, p)
		for _, v := range []string{long, long[:299] + "x"} {
			var got []bool
			for i := 0; i < 3; i++ {
				got = append(got, e.check(t, req("GET", "/", "tenant", v)).Allowed)
			}
			assert.Equal(t, []bool{true, true, false}, got)
		}
	})
}
