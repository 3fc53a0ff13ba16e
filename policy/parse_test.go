package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/outcome"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// strip clears the unexported position bookkeeping so that policies can be compared.
func strip(p *Policy) *Policy {
	q := *p
	q.file, q.positions = "", nil
	q.Tiers = map[string]Tier{}
	for k, t := range p.Tiers {
		t.positions = nil
		q.Tiers[k] = t
	}
	q.Rules = append([]Rule(nil), p.Rules...)
	for i := range q.Rules {
		q.Rules[i].line, q.Rules[i].column, q.Rules[i].positions = 0, 0, nil
	}
	return &q
}

// fullPolicy is testdata/full.yaml built in Go.
func fullPolicy() *Policy {
	return &Policy{
		MissingKey:  MissingReject,
		DefaultTier: "free",
		Tiers: map[string]Tier{
			"free":       {PerMinute: 60, PerHour: 1000},
			"pro":        {PerMinute: 600, PerHour: 20000},
			"enterprise": {PerSecond: 100, PerMinute: 6000, PerHour: 300000, PerDay: 5000000},
		},
		Rules: []Rule{
			{ID: "global", Algorithm: Hybrid, Rate: 5000, Burst: 10000, OnFailure: outcome.FailOpen},
			{ID: "tenant", Algorithm: GCRA, Dimensions: []string{"tenant"}, Limit: 1000, Period: time.Minute},
			{ID: "per-key", Dimensions: []string{"api_key"}, Tiered: true},
			{ID: "per-ip", Dimensions: []string{"ip"}, Rate: 10, Burst: 20, MissingKey: MissingSkip},
			{ID: "exports", Algorithm: SlidingLog, Dimensions: []string{"tenant", "route"},
				Match: Match{Routes: []string{"POST /v1/exports"}, Methods: []string{"POST"}},
				Limit: 5, Period: time.Hour, OnFailure: outcome.FailClosed},
			{ID: "writes", Algorithm: FixedWindow, Dimensions: []string{"api_key"}, Limit: 300, Period: time.Minute,
				Cost:  Cost{Fixed: 2, PerMethod: map[string]int64{"GET": 1, "POST": 5}},
				Match: Match{Tiers: []string{"free"}}, OnFailure: outcome.LocalFallback},
			{ID: "search", Dimensions: []string{"api_key", "route"}, Match: Match{Routes: []string{"GET /v1/search"}},
				Rate: 0.5, Burst: 5, Cost: Cost{FuncName: "search_cost"}, Shadow: true},
			{ID: "legacy", Algorithm: TokenBucket, Limit: 100, Period: 10 * time.Second, Cost: Cost{Fixed: 2}, Disabled: true},
		},
	}
}

func TestParseYAMLAndJSONGiveTheSamePolicy(t *testing.T) {
	t.Parallel()
	want := fullPolicy()
	require.NoError(t, want.Validate())
	for _, name := range []string{"testdata/full.yaml", "testdata/full.json"} {
		p, err := LoadFile(name)
		require.NoError(t, err, name)
		assert.Equal(t, want, strip(p), name)
	}
}

func TestParseErrorsNameTheLine(t *testing.T) {
	t.Parallel()
	const head = "version: 1\nrules:\n"
	cases := []struct {
		name, file, src, want string
	}{
		{"unknown top-level field", "p.yaml", "version: 1\nshadw: true\n", "p.yaml:2:1: policy: unknown field \"shadw\""},
		{"unknown rule field", "p.yaml", head + "  - id: a\n    rate: 1\n    burst: 1\n    brust: 2\n", "p.yaml:6:5: rule \"a\": unknown field \"brust\""},
		{"field given twice", "p.yaml", head + "  - id: a\n    rate: 1\n    rate: 2\n    burst: 1\n", "p.yaml:5:5: rule \"a\": field \"rate\" given twice"},
		{"negative rate", "p.yaml", head + "  - id: a\n    rate: -5\n    burst: 1\n", "p.yaml:4:11: rule \"a\": rate -5: want a number above 0"},
		{"rate of the wrong type", "p.yaml", head + "  - id: a\n    rate: [1]\n    burst: 1\n", "p.yaml:4:11: rule \"a\": rate: want a rate, got a list"},
		{"bad rate string", "p.yaml", head + "  - id: a\n    rate: 5/fortnight\n    burst: 1\n", "p.yaml:4:11: rule \"a\": rate: want a number of tokens per second"},
		{"burst as a string", "p.yaml", head + "  - id: a\n    rate: 1\n    burst: \"10\"\n", "p.yaml:5:12: rule \"a\": burst: want an integer, got \"10\""},
		{"unknown algorithm", "p.yaml", head + "  - id: a\n    algorithm: leaky\n    rate: 1\n    burst: 1\n", "p.yaml:4:16: rule \"a\": algorithm \"leaky\""},
		{"period without unit", "p.yaml", head + "  - id: a\n    algorithm: fixed_window\n    limit: 5\n    period: 60\n", "p.yaml:6:13: rule \"a\": period: want a duration with a unit"},
		{"window algorithm with rate", "p.yaml", head + "  - id: a\n    algorithm: fixed_window\n    rate: 5\n    burst: 5\n", "p.yaml:5:5: rule \"a\": algorithm fixed_window counts per window"},
		{"two limit forms", "p.yaml", head + "  - id: a\n    rate: 5\n    burst: 5\n    limit: 5\n    period: 1s\n", "p.yaml:3:5: rule \"a\": want exactly one of rate and burst, limit and period, or tiered"},
		{"duplicate id", "p.yaml", head + "  - {id: a, rate: 1, burst: 1}\n  - {id: a, rate: 1, burst: 1}\n", "p.yaml:4:6: rule \"a\": id \"a\" already used by rules[0]"},
		{"missing id", "p.yaml", head + "  - rate: 1\n    burst: 1\n", "p.yaml:3:5: rules[0]: id is required"},
		{"bad id", "p.yaml", head + "  - {id: \"a b\", rate: 1, burst: 1}\n", "p.yaml:3:6: rule \"a b\": id \"a b\": want 1 to 48 bytes"},
		{"cost above the limit", "p.yaml", head + "  - id: a\n    rate: 1\n    burst: 3\n    cost: 5\n", "p.yaml:6:5: rule \"a\": cost 5 exceeds the limit 3"},
		{"lower-case method cost", "p.yaml", head + "  - id: a\n    rate: 1\n    burst: 3\n    cost: {get: 1}\n", "p.yaml:6:12: rule \"a\": cost: key \"get\": want an upper-case HTTP method"},
		{"tiered without tiers", "p.yaml", head + "  - id: a\n    tiered: true\n", "p.yaml:4:5: rule \"a\": tiered rule, but the policy has no tiers"},
		{"tiers without default", "p.yaml", "tiers:\n  free: {per_minute: 5}\n", "p.yaml:1:1: tiers need a default_tier"},
		{"tier without quota", "p.yaml", "default_tier: free\ntiers:\n  free: {}\n", "p.yaml:3:3: tier \"free\" sets no quota"},
		{"unknown match tier", "p.yaml", "default_tier: free\ntiers:\n  free: {per_minute: 5}\nrules:\n  - id: a\n    rate: 1\n    burst: 1\n    match: {tiers: [gold]}\n", "p.yaml:8:5: rule \"a\": match tier \"gold\" is not one of the tiers"},
		{"bad dimension name", "p.yaml", head + "  - id: a\n    dimensions: [API-Key]\n    rate: 1\n    burst: 1\n", "p.yaml:4:5: rule \"a\": dimension \"API-Key\""},
		{"strict rule without the strict tag", "p.yaml", "strict_tag: tenant\nrules:\n  - id: a\n    algorithm: gcra\n    limit: 1\n    period: 1s\n", "p.yaml:3:5: rule \"a\": strict rule lacks the strict_tag dimension \"tenant\""},
		{"bad missing_key", "p.yaml", "missing_key: allow\n", "p.yaml:1:14: missing_key \"allow\""},
		{"bad on_failure", "p.yaml", head + "  - {id: a, rate: 1, burst: 1, on_failure: retry}\n", "p.yaml:3:44: rule \"a\": on_failure \"retry\""},
		{"enabled not a bool", "p.yaml", head + "  - {id: a, rate: 1, burst: 1, enabled: yes}\n", "p.yaml:3:41: rule \"a\": enabled: want true or false, got \"yes\""},
		{"wrong version", "p.yaml", "version: 2\n", "p.yaml:1:10: version 2"},
		{"rules not a list", "p.yaml", "rules: {id: a}\n", "p.yaml:1:8: rules: want a list of rules, got a mapping"},
		{"alias", "p.yaml", "rules:\n  - &r {id: a, rate: 1, burst: 1}\n  - *r\n", "p.yaml:3:5: rules[1]: YAML aliases are not supported"},
		{"YAML syntax", "p.yaml", "rules:\n  - id: a\n   rate: 1\n", "p.yaml:3: syntax error"},
		{"two documents", "p.yaml", "version: 1\n---\nversion: 1\n", "p.yaml:2:1: more than one YAML document"},
		{"empty", "p.yaml", "", "p.yaml: empty policy"},
		{"JSON syntax", "p.json", "{\n  \"rules\": [\n    {\"id\": \"a\",}\n  ]\n}\n", "p.json:3:16: JSON syntax error"},
		{"JSON unknown field", "p.json", "{\n  \"rules\": [\n    {\"id\": \"a\", \"rate\": 1, \"burst\": 1, \"cost\": 1, \"colour\": 1}\n  ]\n}\n", "p.json:3:51: rule \"a\": unknown field \"colour\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.src), tc.file)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalid), "%v does not wrap ErrInvalid", err)
			var pe *Error
			require.True(t, errors.As(err, &pe))
			assert.True(t, strings.HasPrefix(err.Error(), tc.want), "got  %s\nwant %s...", err, tc.want)
		})
	}
}

func TestParseRateForms(t *testing.T) {
	t.Parallel()
	for src, want := range map[string]float64{
		"5": 5, "0.5": 0.5, "100/s": 100, "60/m": 1, "3600/h": 1, "86400/d": 1, "10/10s": 1, "1/500ms": 2,
	} {
		p, err := Parse([]byte("rules:\n  - {id: a, burst: 100, rate: "+src+"}\n"), "p.yaml")
		require.NoError(t, err, src)
		assert.InDelta(t, want, p.Rules[0].Rate, 1e-12, src)
	}
}

func TestLoadFileErrors(t *testing.T) {
	t.Parallel()
	_, err := LoadFile(filepath.Join(t.TempDir(), "missing.yaml"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "missing.yaml")

	big := filepath.Join(t.TempDir(), "big.yaml")
	require.NoError(t, os.WriteFile(big, make([]byte, MaxFileSize+1), 0o600))
	_, err = LoadFile(big)
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "larger than")
}

func TestValidateGoPolicies(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		p    *Policy
		want string
	}{
		{"nil", nil, "policy: nil policy"},
		{"no limit", &Policy{Rules: []Rule{{ID: "a"}}}, `policy: rule "a": want exactly one of`},
		{"NaN rate", &Policy{Rules: []Rule{{ID: "a", Rate: nanRate(), Burst: 1}}}, `policy: rule "a": rate NaN`},
		{"burst without rate", &Policy{Rules: []Rule{{ID: "a", Burst: 1}}}, `policy: rule "a": rate 0`},
		{"strict period too short", &Policy{Rules: []Rule{{ID: "a", Algorithm: GCRA, Limit: 1, Period: time.Microsecond}}}, `policy: rule "a": period 1µs`},
		{"sliding log too large", &Policy{Rules: []Rule{{ID: "a", Algorithm: SlidingLog, Limit: 200000, Period: time.Hour}}}, `policy: rule "a": rule "a": sliding log limit`},
		{"func and name", &Policy{Rules: []Rule{{ID: "a", Rate: 1, Burst: 1, Cost: Cost{Func: func(*Request) int64 { return 1 }, FuncName: "x"}}}}, `policy: rule "a": cost sets both`},
		{"bad failure policy", &Policy{Rules: []Rule{{ID: "a", Rate: 1, Burst: 1, OnFailure: 7}}}, `policy: rule "a": on_failure FailurePolicy(7)`},
		{"global with others", &Policy{Rules: []Rule{{ID: "a", Rate: 1, Burst: 1, Dimensions: []string{"global", "ip"}}}}, `policy: rule "a": dimension global cannot be combined`},
		{"too many strict counters", &Policy{Rules: manyStrict(17)}, `policy: rule "r16": more than 16 strict counters`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalid)
			assert.True(t, strings.HasPrefix(err.Error(), tc.want), "got  %s\nwant %s...", err, tc.want)
		})
	}
	require.NoError(t, (&Policy{Rules: manyStrict(16)}).Validate())
}

func nanRate() float64 { z := 0.0; return z / z }

func manyStrict(n int) []Rule {
	rules := make([]Rule, n)
	for i := range rules {
		rules[i] = Rule{ID: "r" + string(rune('a'+i/26)) + string(rune('a'+i%26)), Algorithm: GCRA, Limit: 10, Period: time.Second}
		rules[i].ID = "r" + itoa(i)
	}
	return rules
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

func TestParsePeriodAndWindowTogether(t *testing.T) {
	t.Parallel()
	for _, src := range []string{
		"rules:\n  - {id: a, algorithm: fixed_window, limit: 1, period: 1s, window: 1s}\n",
		"rules:\n  - {id: a, algorithm: fixed_window, limit: 1, window: 1s, period: 1s}\n",
	} {
		_, err := Parse([]byte(src), "p.yaml")
		assert.ErrorContains(t, err, "give period or window, not both")
	}
}

// FuzzParse checks that no input makes Parse panic, and that every refusal is an *Error.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"testdata/full.yaml", "testdata/full.json"} {
		data, err := os.ReadFile(name)
		require.NoError(f, err)
		f.Add(data, strings.HasSuffix(name, ".json"))
	}
	f.Add([]byte("rules:\n  - &a {id: x}\n  - *a\n"), false)
	f.Add([]byte("{\"rules\": [{\"id\": \"a\", \"rate\": \"1e400/s\", \"burst\": 1}]}"), true)
	f.Add([]byte("rules:\n  - {id: a, rate: .nan, burst: 1}\n"), false)
	f.Add([]byte("tiers: {free: {per_minute: 9223372036854775807}}\ndefault_tier: free\n"), false)
	f.Fuzz(func(t *testing.T, data []byte, isJSON bool) {
		name := "f.yaml"
		if isJSON {
			name = "f.json"
		}
		start := time.Now()
		p, err := Parse(data, name)
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Parse of %d bytes took %v", len(data), d)
		}
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v (%T) is not an *Error", err, err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("Parse accepted a policy Validate refuses: %v", err)
		}
	})
}
