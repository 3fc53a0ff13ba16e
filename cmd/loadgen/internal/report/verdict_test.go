package report

import (
	"bytes"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// verdictReport returns a report of scenario name with a hybrid and a central result that meet
// every target: tweak them to fail one.
func verdictReport(name, pattern string, load float64) Report {
	acc := Accuracy{Oracle: true, ActiveKeys: 200, ExactTokens: 100_000, AdmittedPerExact: 1.000, UnderExactRate: 0.0001, MaxKeyRatio: 0.99, HonestKeys: 200}
	return Report{
		Scenario: Scenario{Name: name, Pattern: pattern, Load: load},
		Results: []Result{
			{
				Mode: "hybrid", Decisions: 100_000, Local: 99_500, LocalShare: 0.995,
				First:    FirstDecisions{Keys: 20_000, Local: 19_990, LocalShare: 0.9995, RedisCPUMsPerThousand: 5},
				Accuracy: acc,
				Latency:  Latency{P99: Duration(1100 * time.Nanosecond)},
				RedisCPU: &RedisCPU{MsPerThousand: 0.1},
			},
			{
				Mode: "central", Decisions: 100_000,
				Accuracy: acc,
				Latency:  Latency{P99: Duration(800 * time.Microsecond)},
				RedisCPU: &RedisCPU{MsPerThousand: 20},
			},
		},
	}
}

func TestJudge(t *testing.T) {
	t.Parallel()
	type want struct{ what, got, target, status string }
	tests := []struct {
		name     string
		scenario string // verdictReport's arguments
		pattern  string
		load     float64
		tweak    func(r *Report) // nil: every target met
		label    string
		checks   []want // in order
		note     string
	}{
		{
			name:     "sparse, every target met",
			scenario: "sparse", pattern: "uniform", load: 0.5,
			label: "sparse",
			checks: []want{
				{"local", "99.5%", "≥ 99%", StatusOK},
				{"p99", "1.1µs", "≤ central/50 (16µs)", StatusOK},
				{"redis cpu/1k vs central", "0.005×", "≤ 1/2", StatusOK},
				{"false denials", "0.01%", "≤ 0.5%", StatusOK},
				{"admitted/exact", "1.000", "≤ 1.01", StatusOK},
			},
		},
		{
			name:     "hot, each honest target missed",
			scenario: "hot", pattern: "uniform", load: 0.8,
			tweak: func(r *Report) {
				h := &r.Results[0]
				h.LocalShare = 0.97
				h.Latency.P99 = Duration(20 * time.Microsecond)
				h.RedisCPU.MsPerThousand = 1 // 1/20 of central's
				h.Accuracy.UnderExactRate = 0.006
				h.Accuracy.AdmittedPerExact = 1.02
			},
			label: "hot",
			checks: []want{
				{"local", "97.0%", "≥ 99%", StatusFail},
				{"p99", "20µs", "≤ central/50 (16µs)", StatusFail},
				{"redis cpu/1k vs central", "0.05×", "≤ 1/50", StatusFail},
				{"false denials", "0.60%", "≤ 0.5%", StatusFail},
				{"admitted/exact", "1.020", "≤ 1.01", StatusFail},
			},
		},
		{
			name:     "zipf asks 95% local",
			scenario: "zipf", pattern: "zipf", load: 0.5, tweak: func(r *Report) { r.Results[0].LocalShare = 0.96 },
			label:  "zipf",
			checks: []want{{"local", "96.0%", "≥ 95%", StatusOK}, {"p99", "", "", StatusOK}, {"redis cpu/1k vs central", "", "≤ 1/2", StatusOK}, {"false denials", "", "", StatusOK}, {"admitted/exact", "", "", StatusOK}},
		},
		{
			name:     "medium and sticky have their own cpu targets",
			scenario: "sticky", pattern: "uniform", load: 0.5,
			tweak: func(r *Report) {
				r.Results[0].RedisCPU.MsPerThousand = 5
			},
			label:  "sticky",
			checks: []want{{"local", "", "", StatusOK}, {"p99", "", "", StatusOK}, {"redis cpu/1k vs central", "0.25×", "≤ 1/5", StatusFail}, {"false denials", "", "", StatusOK}, {"admitted/exact", "", "", StatusOK}},
		},
		{
			name:     "overload: accuracy within 0.97–1.01 and no key above 1.05",
			scenario: "overload", pattern: "uniform", load: 4,
			tweak: func(r *Report) {
				r.Results[0].Accuracy.AdmittedPerExact = 0.96
				r.Results[0].Accuracy.MaxKeyRatio = 1.06
			},
			label: "overload",
			checks: []want{
				{"local", "99.5%", "≥ 95%", StatusOK},
				{"redis cpu/1k vs central", "0.005×", "≤ 1/5", StatusOK},
				{"admitted/exact", "0.960", "in 0.97–1.01", StatusFail},
				{"max key", "1.060", "≤ 1.05", StatusFail},
			},
		},
		{
			name:     "churn: new keys' first decisions and their Redis cost",
			scenario: "churn", pattern: "churn", load: 0,
			tweak: func(r *Report) {
				r.Results[0].First.RedisCPUMsPerThousand = 25 // more per new key than central per decision
			},
			label: "churn",
			checks: []want{
				{"first decisions local", "100.0%", "≥ 99%", StatusOK},
				{"redis cpu per new key", "25 ms/1k", "≤ central's per decision (20 ms/1k)", StatusFail},
			},
		},
		{
			name:     "no INFO cpu (miniredis): not measured, neither ok nor FAIL",
			scenario: "medium", pattern: "uniform", load: 0.8,
			tweak: func(r *Report) {
				r.Results[0].RedisCPU, r.Results[1].RedisCPU = nil, nil
			},
			label:  "medium",
			checks: []want{{"local", "", "", StatusOK}, {"p99", "", "", StatusOK}, {"redis cpu/1k vs central", "no INFO cpu", "≤ 1/10", StatusNA}, {"false denials", "", "", StatusOK}, {"admitted/exact", "", "", StatusOK}},
		},
		{
			name:     "too many requests to replay: the approximate figures, marked",
			scenario: "sparse", pattern: "uniform", load: 0.5,
			tweak: func(r *Report) {
				a := &r.Results[0].Accuracy
				a.Oracle, a.AdmittedPerIdeal, a.FalseDenialRate = false, 0.999, 0.001
			},
			label:  "sparse",
			checks: []want{{"local", "", "", StatusOK}, {"p99", "", "", StatusOK}, {"redis cpu/1k vs central", "", "", StatusOK}, {"false denials", "~0.10%", "≤ 0.5%", StatusOK}, {"admitted/exact", "~0.999", "≤ 1.01", StatusOK}},
		},
		{
			name:     "a custom overload run gets the overload targets without the cpu one",
			scenario: "", pattern: "uniform", load: 4,
			label:  "custom, overload targets",
			checks: []want{{"local", "", "", StatusOK}, {"admitted/exact", "", "", StatusOK}, {"max key", "", "", StatusOK}},
		},
		{
			name:     "a custom honest run gets the honest targets without the cpu one",
			scenario: "", pattern: "zipf", load: 0.9,
			label:  "custom, honest-load targets",
			checks: []want{{"local", "", "", StatusOK}, {"p99", "", "", StatusOK}, {"false denials", "", "", StatusOK}, {"admitted/exact", "", "", StatusOK}},
		},
		{
			name:     "without central there is nothing to judge",
			scenario: "sparse", pattern: "uniform", load: 0.5, tweak: func(r *Report) { r.Results = r.Results[:1] },
			label: "sparse",
			note:  "needs hybrid and central in the same run (--mode hybrid,central)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := verdictReport(tt.scenario, tt.pattern, tt.load)
			if tt.tweak != nil {
				tt.tweak(&r)
			}
			v := Judge(r)
			assert.Equal(t, tt.label, v.Scenario)
			assert.Equal(t, tt.note, v.Note)
			require.Len(t, v.Checks, len(tt.checks), "%+v", v.Checks)
			for i, w := range tt.checks {
				c := v.Checks[i]
				assert.Equal(t, w.what, c.What, "check %d", i)
				assert.Equal(t, w.status, c.Status, "check %d: %s", i, c.What)
				if w.got != "" {
					assert.Equal(t, w.got, c.Got, "check %d: %s", i, c.What)
				}
				if w.target != "" {
					assert.Equal(t, w.target, c.Want, "check %d: %s", i, c.What)
				}
			}
		})
	}
}

func TestVerdictString(t *testing.T) {
	t.Parallel()
	v := Judge(verdictReport("sparse", "uniform", 0.5))
	assert.Equal(t, "verdict (sparse): local 99.5% ≥ 99% ok · p99 1.1µs ≤ central/50 (16µs) ok · redis cpu/1k vs central 0.005× ≤ 1/2 ok"+
		" · false denials 0.01% ≤ 0.5% ok · admitted/exact 1.000 ≤ 1.01 ok → all 5 met", v.String())

	r := verdictReport("sparse", "uniform", 0.5)
	r.Results[0].LocalShare = 0.5
	r.Results[0].RedisCPU = nil
	r.Results[0].Partial = true
	assert.Equal(t, "verdict (sparse): local 50.0% ≥ 99% FAIL · p99 1.1µs ≤ central/50 (16µs) ok · redis cpu/1k vs central no INFO cpu ≤ 1/2 n/a"+
		" · false denials 0.01% ≤ 0.5% ok · admitted/exact 1.000 ≤ 1.01 ok → 1 of 4 FAIL, 1 not measured; interrupted: figures cover the part that ran",
		Judge(r).String())

	assert.Equal(t, "verdict (custom, honest-load targets): needs hybrid and central in the same run (--mode hybrid,central)",
		Judge(Report{}).String())
}

func TestWriteTablePrintsTheVerdictUnderTheTable(t *testing.T) {
	t.Parallel()
	r := verdictReport("sparse", "uniform", 0.5)
	var b bytes.Buffer
	require.NoError(t, WriteTable(&b, r))
	out := b.String()
	assert.Contains(t, out, "hybridrate loadgen: scenario sparse:")
	assert.Regexp(t, `(?m)^\s+central\s.*\n`+regexp.QuoteMeta(Judge(r).String())+`\n`, out, "the line right under the table")
}
