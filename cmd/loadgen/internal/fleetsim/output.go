package fleetsim

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Meta describes a run for its outputs.
type Meta struct {
	Duration, Warmup time.Duration
	Seed             uint64
	IdleCPU          float64 // the idle server's CPU, seconds per second
	Redis            string  // redis_version
}

// WriteTable writes the results as a Markdown table, one row per scenario and node count.
func WriteTable(w io.Writer, m Meta, rs []Result) error {
	rs = append([]Result(nil), rs...)
	sortResults(rs)
	var b strings.Builder
	fmt.Fprintf(&b, "fleet simulator: %v of virtual time per run (window after %v of warm-up), seed %d, redis %s, idle server %.2f ms CPU/s subtracted\n\n",
		m.Duration, m.Warmup, m.Seed, m.Redis, m.IdleCPU*1e3)
	b.WriteString("| scenario | N | relays | local | fallback | Redis calls /1k | key-calls /1k | Redis CPU µs /1k | central µs /1k (before–after) | CPU ÷ central | rounds/s | worst key ÷ (B+R·T) | admitted ÷ exact | false denials (honest) | under exact | p50 µs | p99 µs | p99.9 µs | central p99 µs | wall s |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %d | %s | %.2f%% | %.2f%% | %.1f | %.1f | %.0f | %.0f (%.0f–%.0f) | %.3f | %.0f | %.3f | %.3f | %.2f%% | %.2f%% | %.2f | %.1f | %.1f | %.1f | %.1f |\n",
			r.Scenario, r.Nodes, relaysCell(r), 100*r.Local, 100*r.Fallback, r.Calls, r.KeyCalls, r.CPU, r.CentralCPU,
			r.CentralCPUBefore, r.CentralCPUAfter, r.CPURatio, r.Rounds,
			r.WorstKey, r.PerExact, 100*r.FalseDenied, 100*r.UnderExact, r.P50us, r.P99us, r.P999us, r.CP99us, r.WallSeconds)
	}
	for _, r := range rs {
		if r.FailedSteps > 0 {
			fmt.Fprintf(&b, "\n%s, %d nodes: %d background steps had a failed round (a Redis timeout on a loaded machine, most often); their keys stayed pending for the next round, as in production.\n",
				r.Scenario, r.Nodes, r.FailedSteps)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the run and its results as JSON.
func WriteJSON(w io.Writer, m Meta, rs []Result) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(struct {
		Duration, Warmup string
		Seed             uint64
		IdleCPUms        float64 `json:"idle_cpu_ms_per_s"`
		Redis            string
		Results          []Result
	}{m.Duration.String(), m.Warmup.String(), m.Seed, m.IdleCPU * 1e3, m.Redis, rs})
}

// WriteCSV writes the results as CSV with a header row.
func WriteCSV(w io.Writer, _ Meta, rs []Result) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"scenario", "nodes", "relays", "local_share", "fallback_share", "redis_calls_per_1k", "key_calls_per_1k",
		"redis_cpu_us_per_1k", "central_cpu_us_per_1k", "cpu_ratio", "rounds_per_s", "worst_key_per_allowance",
		"admitted_per_exact", "false_denied", "under_exact", "p50_us", "p99_us", "p999_us", "central_p99_us", "sharded"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	for _, r := range rs {
		_ = cw.Write([]string{r.Scenario, strconv.Itoa(r.Nodes), strconv.Itoa(r.Relays), f(r.Local), f(r.Fallback), f(r.Calls), f(r.KeyCalls), f(r.CPU),
			f(r.CentralCPU), f(r.CPURatio), f(r.Rounds), f(r.WorstKey), f(r.PerExact), f(r.FalseDenied),
			f(r.UnderExact), f(r.P50us), f(r.P99us), f(r.P999us), f(r.CP99us), strconv.FormatBool(r.Sharded)})
	}
	cw.Flush()
	return cw.Error()
}

// Chart is one figure drawn against the number of nodes, a line per scenario.
type Chart struct {
	File, Title, Y string
	Value          func(Result) float64
	Log            bool    // a logarithmic y axis
	Target         float64 // a dashed line at this value (0: none)
}

// Charts are the figures the simulator draws.
var Charts = []Chart{
	{File: "cpu-ratio", Title: "Redis CPU per decision ÷ a central bucket's", Y: "ratio", Log: true, Target: 1,
		Value: func(r Result) float64 { return r.CPURatio }},
	{File: "local", Title: "Share of decisions made locally", Y: "%",
		Value: func(r Result) float64 { return 100 * r.Local }},
	{File: "worst-key", Title: "Worst key's admitted ÷ (Burst + Rate·T)", Y: "ratio", Target: 1.01,
		Value: func(r Result) float64 { return r.WorstKey }},
	{File: "p99", Title: "p99 decision latency (µs; dashed: central's, median over runs)", Y: "µs", Log: true,
		Value: func(r Result) float64 { return r.P99us }},
	{File: "false-denials", Title: "False denials (honest keys), %", Y: "%",
		Value: func(r Result) float64 { return 100 * r.FalseDenied }},
}

// WriteSVG draws ch against N (log2 axis), a line per scenario.
func WriteSVG(w io.Writer, ch Chart, rs []Result) error {
	rs = append([]Result(nil), rs...)
	sortResults(rs)
	const W, H, left, right, top, bottom = 760, 420, 70, 170, 40, 50
	var ns []int
	seenN := map[int]bool{}
	var names []string
	seenS := map[string]bool{}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rs {
		if !seenN[r.Nodes] {
			seenN[r.Nodes] = true
			ns = append(ns, r.Nodes)
		}
		if !seenS[r.Scenario] {
			seenS[r.Scenario] = true
			names = append(names, r.Scenario)
		}
		v := ch.Value(r)
		if ch.Log && v <= 0 {
			continue
		}
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	if ch.Target > 0 {
		lo, hi = math.Min(lo, ch.Target), math.Max(hi, ch.Target)
	}
	if len(rs) == 0 || math.IsInf(lo, 1) {
		lo, hi = 0, 1
	}
	sortInts(ns)
	minN, maxN := float64(ns[0]), float64(ns[len(ns)-1])
	x := func(n float64) float64 {
		if maxN == minN {
			return left + (W-left-right)/2
		}
		return left + (math.Log2(n)-math.Log2(minN))/(math.Log2(maxN)-math.Log2(minN))*(W-left-right)
	}
	yt := func(v float64) float64 { return v }
	if ch.Log {
		yt = math.Log10
		lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	} else {
		span := hi - lo
		if span == 0 {
			span = math.Max(math.Abs(hi)*0.1, 1)
		}
		lo, hi = lo-0.05*span, hi+0.05*span
		if lo > 0 && lo < 0.3*hi {
			lo = 0
		}
	}
	y := func(v float64) float64 {
		return top + (1-(yt(v)-yt(lo))/(yt(hi)-yt(lo)))*(H-top-bottom)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s</text>`+"\n", left, html.EscapeString(ch.Title))
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, H-bottom, W-right, H-bottom)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top, left, H-bottom)
	for _, n := range ns {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x(float64(n)), H-bottom+16, n)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">nodes (log scale)</text>`+"\n", left+(W-left-right)/2, H-12)
	for i := 0; i <= 4; i++ {
		var v float64
		if ch.Log {
			v = math.Pow(10, yt(lo)+(yt(hi)-yt(lo))*float64(i)/4)
		} else {
			v = lo + (hi-lo)*float64(i)/4
		}
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, short(v))
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(v), W-right, y(v))
	}
	if ch.Target > 0 {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#c00" stroke-dasharray="6 4"/>`+"\n",
			left, y(ch.Target), W-right, y(ch.Target))
	}
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}
	for si, name := range names {
		col := colors[si%len(colors)]
		var pts []string
		for _, r := range rs {
			v := ch.Value(r)
			if r.Scenario != name || ch.Log && v <= 0 {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(r.Nodes)), y(v)))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(float64(r.Nodes)), y(v), col)
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), col)
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			W-right+14, top+si*18, col, W-right+32, top+si*18+10, html.EscapeString(name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// short formats an axis value.
func short(v float64) string {
	switch a := math.Abs(v); {
	case a == 0:
		return "0"
	case a >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 0.1:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	return strconv.FormatFloat(v, 'g', 2, 64)
}

// relaysCell is the table's relays column: the count, "by key" when keys were sharded over them.
func relaysCell(r Result) string {
	if r.Sharded {
		return fmt.Sprintf("%d by key", r.Relays)
	}
	return strconv.Itoa(r.Relays)
}
