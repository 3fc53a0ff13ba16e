package report

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Targets are what a scenario asks of hybrid, judged against central (the strict central Lua
// token bucket) in the same run: issue 10's targets. A zero field is not checked.
type Targets struct {
	MinLocal        float64 // share of hybrid's decisions made locally
	P99Divisor      float64 // hybrid's p99 at most central's p99 ÷ P99Divisor
	MaxFalseDenials float64 // false denials, as a share of the exact bucket's tokens
	MinExact        float64 // admitted/exact at least
	MaxExact        float64 // admitted/exact at most
	MaxKeyRatio     float64 // no key above MaxKeyRatio × (Burst + Rate·T)
	MaxCPURatio     float64 // hybrid's Redis CPU per 1,000 decisions ÷ central's
	MinFirstLocal   float64 // share of new keys whose first decision was local
	NewKeyCPU       bool    // hybrid's Redis CPU per new key at most central's per decision
}

// The targets of each scenario preset. Honest load: local ≥ 99% (zipf 95%), p99 ≤ central/50,
// false denials ≤ 0.5%, admitted/exact ≤ 1.01, and a Redis CPU ratio per scenario.
var scenarioTargets = map[string]Targets{
	"hot":      honestTargets(0.99, 1.0/50),
	"medium":   honestTargets(0.99, 1.0/10),
	"sparse":   honestTargets(0.99, 1.0/2),
	"sticky":   honestTargets(0.99, 1.0/5),
	"zipf":     honestTargets(0.95, 1.0/2),
	"overload": {MinLocal: 0.95, MinExact: 0.97, MaxExact: 1.01, MaxKeyRatio: 1.05, MaxCPURatio: 1.0 / 5},
	// The issue asks that new keys' first decisions be local; 99% is the honest-load bar.
	"churn": {MinFirstLocal: 0.99, NewKeyCPU: true},
}

func honestTargets(local, cpu float64) Targets {
	return Targets{MinLocal: local, P99Divisor: 50, MaxFalseDenials: 0.005, MaxExact: 1.01, MaxCPURatio: cpu}
}

// TargetsFor returns the targets a run is judged by and how to name them: a preset's own, or for a
// run without one, the honest-load, overload or churn targets its workload matches, without a
// Redis CPU target (that one depends on the key shape).
func TargetsFor(s Scenario) (name string, t Targets) {
	if t, ok := scenarioTargets[s.Name]; ok {
		return s.Name, t
	}
	switch {
	case s.Pattern == "churn":
		return "custom, churn targets", scenarioTargets["churn"]
	case s.Load > 1:
		t := scenarioTargets["overload"]
		t.MaxCPURatio = 0
		return "custom, overload targets", t
	}
	return "custom, honest-load targets", honestTargets(0.99, 0)
}

// Check is one target of a verdict.
type Check struct {
	What   string `json:"what"`   // e.g. "local"
	Got    string `json:"got"`    // the measured figure, as printed
	Want   string `json:"want"`   // the target, as printed, e.g. "≥ 99%"
	Status string `json:"status"` // StatusOK, StatusFail or StatusNA
}

// The values of Check.Status.
const (
	StatusOK   = "ok"
	StatusFail = "FAIL"
	StatusNA   = "n/a" // not measured in this run (e.g. no INFO cpu on miniredis)
)

// Verdict is hybrid judged against central on a scenario's targets.
type Verdict struct {
	Scenario string  `json:"scenario"`
	Checks   []Check `json:"checks,omitempty"`
	Note     string  `json:"note,omitempty"` // why there are no checks, or a caveat
}

// Judge returns the verdict of r: hybrid's figures against its scenario's targets, central's
// figures in the same run giving the relative ones. It is a pure function of r.
func Judge(r Report) Verdict {
	name, t := TargetsFor(r.Scenario)
	v := Verdict{Scenario: name}
	var hyb, cen *Result
	for i := range r.Results {
		switch r.Results[i].Mode {
		case "hybrid":
			hyb = &r.Results[i]
		case "central":
			cen = &r.Results[i]
		}
	}
	if hyb == nil || cen == nil {
		v.Note = "needs hybrid and central in the same run (--mode hybrid,central)"
		return v
	}
	if hyb.Partial || cen.Partial {
		v.Note = "interrupted: figures cover the part that ran"
	}
	add := func(what, got, want string, ok bool) {
		st := StatusFail
		if ok {
			st = StatusOK
		}
		v.Checks = append(v.Checks, Check{What: what, Got: got, Want: want, Status: st})
	}
	na := func(what, want, why string) {
		v.Checks = append(v.Checks, Check{What: what, Got: why, Want: want, Status: StatusNA})
	}
	pct := func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

	if t.MinLocal > 0 {
		want := "≥ " + trimPct(t.MinLocal)
		if hyb.Decisions == 0 {
			na("local", want, "no decisions")
		} else {
			add("local", pct(hyb.LocalShare), want, hyb.LocalShare >= t.MinLocal)
		}
	}
	if t.MinFirstLocal > 0 {
		want := "≥ " + trimPct(t.MinFirstLocal)
		if hyb.First.Keys == 0 {
			na("first decisions local", want, "no new keys")
		} else {
			add("first decisions local", pct(hyb.First.LocalShare), want, hyb.First.LocalShare >= t.MinFirstLocal)
		}
	}
	if t.P99Divisor > 0 {
		h, c := time.Duration(hyb.Latency.P99), time.Duration(cen.Latency.P99)
		want := fmt.Sprintf("≤ central/%g", t.P99Divisor)
		if h <= 0 || c <= 0 {
			na("p99", want, "no latencies")
		} else {
			bound := time.Duration(float64(c) / t.P99Divisor)
			add("p99", FmtDur(h), fmt.Sprintf("%s (%s)", want, FmtDur(bound)), float64(h) <= float64(c)/t.P99Divisor)
		}
	}
	if t.MaxCPURatio > 0 {
		want := "≤ " + fraction(t.MaxCPURatio)
		h, c := hyb.RedisCPU, cen.RedisCPU
		switch {
		case h == nil || c == nil:
			na("redis cpu/1k vs central", want, "no INFO cpu")
		case c.MsPerThousand <= 0:
			na("redis cpu/1k vs central", want, "central used no measurable CPU")
		default:
			q := h.MsPerThousand / c.MsPerThousand
			add("redis cpu/1k vs central", fmt.Sprintf("%.3g×", q), want, q <= t.MaxCPURatio)
		}
	}
	if t.NewKeyCPU {
		const what = "redis cpu per new key"
		h, c := hyb.RedisCPU, cen.RedisCPU
		switch {
		case h == nil || c == nil:
			na(what, "≤ central's per decision", "no INFO cpu")
		case hyb.First.Keys == 0:
			na(what, "≤ central's per decision", "no new keys")
		default:
			add(what, fmt.Sprintf("%.3g ms/1k", hyb.First.RedisCPUMsPerThousand),
				fmt.Sprintf("≤ central's per decision (%.3g ms/1k)", c.MsPerThousand),
				hyb.First.RedisCPUMsPerThousand <= c.MsPerThousand)
		}
	}
	a := hyb.Accuracy
	if t.MaxFalseDenials > 0 {
		want := "≤ " + trimPct(t.MaxFalseDenials)
		switch {
		case a.Oracle:
			add("false denials", fmt.Sprintf("%.2f%%", 100*a.UnderExactRate), want, a.UnderExactRate <= t.MaxFalseDenials)
		case a.HonestKeys > 0:
			add("false denials", fmt.Sprintf("~%.2f%%", 100*a.FalseDenialRate), want, a.FalseDenialRate <= t.MaxFalseDenials)
		default:
			na("false denials", want, "no reference")
		}
	}
	if t.MaxExact > 0 || t.MinExact > 0 {
		got, ratio := "", 0.0
		switch {
		case a.Oracle:
			ratio, got = a.AdmittedPerExact, fmt.Sprintf("%.3f", a.AdmittedPerExact)
		case a.ActiveKeys > 0:
			ratio, got = a.AdmittedPerIdeal, fmt.Sprintf("~%.3f", a.AdmittedPerIdeal)
		}
		var want string
		switch {
		case t.MinExact > 0 && t.MaxExact > 0:
			want = fmt.Sprintf("in %g–%g", t.MinExact, t.MaxExact)
		case t.MaxExact > 0:
			want = fmt.Sprintf("≤ %g", t.MaxExact)
		default:
			want = fmt.Sprintf("≥ %g", t.MinExact)
		}
		if got == "" {
			na("admitted/exact", want, "no demand")
		} else {
			add("admitted/exact", got, want, (t.MinExact == 0 || ratio >= t.MinExact) && (t.MaxExact == 0 || ratio <= t.MaxExact))
		}
	}
	if t.MaxKeyRatio > 0 {
		want := fmt.Sprintf("≤ %g", t.MaxKeyRatio)
		if a.ActiveKeys == 0 {
			na("max key", want, "no demand")
		} else {
			add("max key", fmt.Sprintf("%.3f", a.MaxKeyRatio), want, a.MaxKeyRatio <= t.MaxKeyRatio)
		}
	}
	return v
}

// String renders v on one line: "verdict (sparse): local 99.4% ≥ 99% ok · … → all 5 met".
func (v Verdict) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "verdict (%s):", v.Scenario)
	var failed, unmeasured int
	for i, c := range v.Checks {
		if i > 0 {
			b.WriteString(" ·")
		}
		fmt.Fprintf(&b, " %s %s %s %s", c.What, c.Got, c.Want, c.Status)
		switch c.Status {
		case StatusFail:
			failed++
		case StatusNA:
			unmeasured++
		}
	}
	if n := len(v.Checks); n > 0 {
		measured := n - unmeasured
		switch {
		case failed > 0:
			fmt.Fprintf(&b, " → %d of %d FAIL", failed, measured)
		default:
			fmt.Fprintf(&b, " → all %d met", measured)
		}
		if unmeasured > 0 {
			fmt.Fprintf(&b, ", %d not measured", unmeasured)
		}
	}
	if v.Note != "" {
		if len(v.Checks) > 0 {
			b.WriteString(";")
		}
		b.WriteString(" " + v.Note)
	}
	return b.String()
}

// trimPct formats a share as a percentage without needless decimals: 0.99 → "99%", 0.005 → "0.5%".
func trimPct(f float64) string { return trimFloat(100*f) + "%" }

// fraction formats a ratio target as 1/n when it is one: 0.02 → "1/50".
func fraction(f float64) string {
	if n := math.Round(1 / f); math.Abs(1/f-n) < 1e-9 {
		return fmt.Sprintf("1/%g", n)
	}
	return trimFloat(f)
}
