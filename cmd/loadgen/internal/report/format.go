package report

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable writes the human comparison table, one row per result, and a few lines of detail.
func WriteTable(w io.Writer, r Report) error {
	ew := &errWriter{w: w}
	s := r.Scenario
	name := ""
	if s.Name != "" {
		name = " scenario " + s.Name + ":"
	}
	ew.printf("hybridrate loadgen:%s %d nodes, %s, limit %s/s burst %s per key, cost %d, %s, %s per mode\n",
		name, s.Nodes, keysDesc(s), fmtNum(s.Rate), fmtInt(s.Burst), s.Cost, demandDesc(s), runDesc(s))
	ew.printf("backend: %s; hybrid: sync interval %s, drift %g, policy %s; concurrency %d, seed %d; %s, GOMAXPROCS %d\n",
		s.Backend, time.Duration(s.SyncInterval), s.Drift, s.Policy, s.Concurrency, s.Seed, s.GoVersion, s.GOMAXPROCS)
	ew.printf("\n")

	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	churn := s.Pattern == "churn"
	hdr := "mode\tdecisions/s\tlocal\tadmitted/exact\tover exact\tfalse denials\tmax key\tp50\tp99\tp99.9\tmax\tredis cmds/1k\tin-script/1k\tredis cpu ms/1k\t"
	if churn {
		hdr += "new keys\tfirst local\tcpu ms/1k new\t"
	}
	fmt.Fprintln(tw, hdr)
	partial, approx := false, false
	for _, res := range r.Results {
		name := res.Mode
		if res.Partial {
			name += "*"
			partial = true
		}
		a := res.Accuracy
		exact, over, fd := "-", "-", "-"
		switch {
		case a.Oracle:
			exact = fmt.Sprintf("%.3f", a.AdmittedPerExact)
			over = fmt.Sprintf("%.2f%%", 100*ratio(float64(a.OverExact), float64(a.ExactTokens)))
			fd = fmt.Sprintf("%.2f%%", 100*a.UnderExactRate)
		case a.ActiveKeys > 0:
			approx = true
			exact = fmt.Sprintf("~%.3f", a.AdmittedPerIdeal)
			over = fmt.Sprintf("~%.2f%%", 100*ratio(a.OvershootTokens, a.IdealTokens))
			if a.HonestKeys > 0 {
				fd = fmt.Sprintf("~%.2f%%", 100*a.FalseDenialRate)
			}
		}
		cmds, script, cpu := "-", "-", "-"
		if res.Redis != nil {
			cpu = "n/a"
			if res.RedisCPU != nil {
				cpu = fmt.Sprintf("%.3f", res.RedisCPU.MsPerThousand)
			}
			cmds = fmt.Sprintf("%.2f", res.Redis.PerThousand)
			if res.Redis.ServerSide() {
				script = fmt.Sprintf("%.2f", res.Redis.InScriptPerThousand)
			} else {
				script = "n/a"
			}
		}
		l := res.Latency
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t",
			name, fmtInt(int64(math.Round(res.DecisionsPerSec))), fmtPct(res.LocalShare, res.Decisions), exact, over, fd, a.MaxKeyRatio,
			FmtDur(time.Duration(l.P50)), FmtDur(time.Duration(l.P99)), FmtDur(time.Duration(l.P999)), FmtDur(time.Duration(l.Max)),
			cmds, script, cpu)
		if churn {
			newCPU := "-"
			if res.Redis != nil {
				newCPU = "n/a"
				if res.RedisCPU != nil {
					newCPU = fmt.Sprintf("%.3f", res.First.RedisCPUMsPerThousand)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t", fmtInt(res.First.Keys), fmtPct(res.First.LocalShare, res.First.Keys), newCPU)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	ew.printf("%s\n", Judge(r))
	ew.printf("\n")
	ew.printf("local: decisions made without a Redis round trip on the caller's path (hybrid: local allowance, local denial or deny cache).\n")
	ew.printf("admitted/exact: tokens admitted ÷ tokens an exact token bucket per key admits for the same requests at the same times, all nodes\n")
	ew.printf("  together (1 = exact). over exact: tokens admitted beyond it; false denials: tokens it admitted that this mode denied (both ÷ its total).\n")
	ew.printf("max key: the largest admitted ÷ (Burst + Rate·T) of any key: above 1, a key got more than any exact limiter can give in T.\n")
	ew.printf("latency: one decision as the caller sees it (includes ~30ns of clock reads). redis cmds/1k: commands the clients sent per 1,000\n")
	ew.printf("  decisions, counted by the server; in-script/1k: commands Redis ran inside those scripts. redis cpu ms/1k: CPU time\n")
	ew.printf("  of the whole Redis server (INFO cpu, sys + user, any client's work) during the mode, per 1,000 decisions; n/a: no INFO cpu.\n")
	if churn {
		ew.printf("new keys: distinct keys decided; first local: their first decisions made without a Redis round trip; cpu ms/1k new:\n")
		ew.printf("  the mode's whole Redis CPU per 1,000 new keys (repeat and hot keys' work included: an upper bound per new key).\n")
	}
	if approx {
		ew.printf("~: too many requests to replay exactly; compared with Σ per key min(demand, Burst + Rate·T) instead.\n")
	}
	if partial {
		ew.printf("* interrupted: figures cover the part that ran.\n")
	}
	for _, res := range r.Results {
		details(ew, s, res)
	}
	return ew.err
}

func details(ew *errWriter, s Scenario, res Result) {
	var lines []string
	if src := res.Sources; src != nil && src.Total() > 0 {
		t := float64(src.Total())
		pct := func(n int64) string { return fmt.Sprintf("%.1f%%", 100*float64(n)/t) }
		lines = append(lines, fmt.Sprintf("decisions: local %s allowed + %s denied, central %s allowed + %s denied, deny-cache %s, fallback %s allowed + %s denied",
			pct(src.Local), pct(src.LocalDenied), pct(src.Central), pct(src.CentralDenied), pct(src.DenyCache), pct(src.FallbackAllowed), pct(src.FallbackDenied)))
	}
	if sy := res.Sync; sy != nil {
		per := 0.0
		if sy.Flushes > 0 {
			per = float64(sy.FlushedKeys) / float64(sy.Flushes)
		}
		line := fmt.Sprintf("sync: %s rounds, %s keys (%.1f per round)", fmtInt(sy.Flushes), fmtInt(sy.FlushedKeys), per)
		if sy.Pipelines*2 >= sy.Flushes && sy.Pipelines > 0 {
			line += fmt.Sprintf(", %s pipelines: p50 %s, p99 %s, max %s", fmtInt(sy.Pipelines),
				FmtDur(time.Duration(sy.PipelineLatency.P50)), FmtDur(time.Duration(sy.PipelineLatency.P99)), FmtDur(time.Duration(sy.PipelineLatency.Max)))
		} else {
			line += ", round latency not measured (the rounds bypass the clients' hooks)"
		}
		line += "; script calls counted by the limiters " + fmtInt(sy.LibraryCommands)
		if sy.RedisErrors > 0 || sy.FailedKeys > 0 {
			line += fmt.Sprintf("; %s Redis errors, %s keys failed to reconcile", fmtInt(sy.RedisErrors), fmtInt(sy.FailedKeys))
		}
		lines = append(lines, line)
	}
	if rc := res.Redis; rc != nil && len(rc.ByName) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "redis (%s): %s commands sent", rc.CountedBy, fmtInt(rc.ClientIssued))
		var parts []string
		for _, n := range rc.ByName {
			v := n.Client
			if rc.ServerSide() {
				v = n.Server // a command the server refused (CLIENT SETINFO on Redis < 7.2) is not listed
			}
			if v > 0 && len(parts) < 8 {
				parts = append(parts, fmt.Sprintf("%s %s", n.Name, fmtInt(v)))
			}
		}
		if rc.Setup > 0 {
			fmt.Fprintf(&b, " (+%s connection set-up)", fmtInt(rc.Setup))
		}
		if rc.ServerSide() {
			fmt.Fprintf(&b, ", %s run in scripts", fmtInt(rc.InScript))
		}
		fmt.Fprintf(&b, " [%s]", strings.Join(parts, ", "))
		lines = append(lines, b.String())
	}
	if c := res.RedisCPU; c != nil {
		line := fmt.Sprintf("redis cpu (INFO cpu, whole server): %.1f ms", 1000*c.Seconds)
		if c.MainThreadSeconds > 0 {
			line += fmt.Sprintf(", main thread %.1f ms (%.3f ms/1k)", 1000*c.MainThreadSeconds, c.MainThreadMsPerThousand)
		}
		if c.Servers > 1 {
			line += fmt.Sprintf(", %d servers", c.Servers)
		}
		lines = append(lines, line)
	}
	if len(res.Scripts) > 0 {
		var parts []string
		for _, sc := range res.Scripts {
			parts = append(parts, fmt.Sprintf("%s %s calls, %.1f µs/call", sc.Name, fmtInt(sc.Calls), sc.UsecPerCall))
		}
		lines = append(lines, "scripts (INFO commandstats): "+strings.Join(parts, "; "))
	}
	if res.Errors > 0 {
		lines = append(lines, fmt.Sprintf("errors: %s requests got an error instead of a decision", fmtInt(res.Errors)))
	}
	if res.TargetRPS > 0 && res.AchievedRPS < 0.95*res.TargetRPS {
		lines = append(lines, fmt.Sprintf("achieved %s req/s of the %s targeted: this mode could not keep up on this machine, so its demand was %.2f× the limit, not %g×",
			fmtInt(int64(res.AchievedRPS)), fmtInt(int64(res.TargetRPS)), demandMultiple(res.Accuracy, s, time.Duration(res.Elapsed)), s.Load))
	}
	lines = append(lines, res.Notes...)
	if len(lines) == 0 {
		return
	}
	ew.printf("\n%s:\n", res.Mode)
	for _, l := range lines {
		ew.printf("  %s\n", l)
	}
}

// demandMultiple returns the demand of a run as a multiple of the rate limit of its active keys
// (the burst left out).
func demandMultiple(a Accuracy, s Scenario, elapsed time.Duration) float64 {
	return ratio(float64(a.DemandTokens), s.Rate*elapsed.Seconds()*float64(a.ActiveKeys))
}

func keysDesc(s Scenario) string {
	switch s.Pattern {
	case "zipf":
		return fmt.Sprintf("%s keys (zipf s=%g)", fmtInt(int64(s.Keys)), s.ZipfS) + affinityDesc(s)
	case "hot":
		return "1 hot key" + affinityDesc(s)
	}
	return fmt.Sprintf("%s keys (%s)", fmtInt(int64(s.Keys)), s.Pattern) + affinityDesc(s)
}

func affinityDesc(s Scenario) string {
	if s.Affinity == nil {
		return ""
	}
	return fmt.Sprintf(", affinity %g", *s.Affinity)
}

func demandDesc(s Scenario) string {
	if s.TargetRPS == 0 {
		return "demand as fast as possible"
	}
	if s.Load > 0 {
		return fmt.Sprintf("demand %g× the limit = %s req/s", s.Load, fmtInt(int64(math.Round(s.TargetRPS))))
	}
	return fmt.Sprintf("demand %s req/s", fmtInt(int64(math.Round(s.TargetRPS))))
}

func runDesc(s Scenario) string {
	switch {
	case s.Requests > 0 && s.Duration > 0:
		return fmt.Sprintf("%s requests or %s", fmtInt(s.Requests), time.Duration(s.Duration))
	case s.Requests > 0:
		return fmt.Sprintf("%s requests", fmtInt(s.Requests))
	}
	return time.Duration(s.Duration).String()
}

// fmtPct formats a share as a percentage, or "-" when there was nothing to share (n == 0).
func fmtPct(share float64, n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*share)
}

// FmtDur formats a latency compactly: 85ns, 1.2µs, 340µs, 2.1ms, 1.20s.
func FmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < 10*time.Microsecond:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// fmtInt formats n with thousands separators: 1,234,567.
func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// fmtNum formats a rate: an integer with separators, or with decimals when it has them.
func fmtNum(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return fmtInt(int64(f))
	}
	return strconv.FormatFloat(f, 'g', 6, 64)
}

// WriteJSON writes r as indented JSON.
func WriteJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// CSVHeader is the header row of WriteCSV.
var CSVHeader = []string{
	"mode", "partial", "elapsed_s", "decisions", "allowed", "errors", "decisions_per_sec", "target_rps", "achieved_rps",
	"active_keys", "admitted_tokens", "demand_tokens", "allowance_tokens", "ideal_tokens",
	"admitted_per_ideal", "admitted_per_allowance", "admitted_per_demand", "max_key_ratio", "overshoot_tokens",
	"false_denied_tokens", "false_denial_rate",
	"exact_tokens", "admitted_per_exact", "over_exact_tokens", "under_exact_tokens", "under_exact_rate",
	"latency_p50_ns", "latency_p99_ns", "latency_p999_ns", "latency_max_ns",
	"redis_counted_by", "redis_client_issued", "redis_per_1000", "redis_in_script", "redis_in_script_per_1000",
	"sync_flushes", "sync_flushed_keys", "sync_pipelines", "sync_pipeline_p50_ns", "sync_pipeline_p99_ns",
	"redis_cpu_s", "redis_cpu_ms_per_1000", "redis_cpu_main_thread_s", "redis_cpu_main_thread_ms_per_1000",
	"script_calls", "script_usec_per_call",
	"local_decisions", "local_share", "first_keys", "first_local", "first_local_share",
	"first_redis_cpu_ms_per_1000_keys", "first_redis_cmds_per_1000_keys",
}

// WriteCSV writes one row per result under CSVHeader. Fields that do not apply to a mode are empty.
func WriteCSV(w io.Writer, r Report) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 8, 64) }
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	for _, res := range r.Results {
		a, l := res.Accuracy, res.Latency
		row := []string{
			res.Mode, strconv.FormatBool(res.Partial), f(time.Duration(res.Elapsed).Seconds()),
			i(res.Decisions), i(res.Allowed), i(res.Errors), f(res.DecisionsPerSec), f(res.TargetRPS), f(res.AchievedRPS),
			i(int64(a.ActiveKeys)), i(a.AdmittedTokens), i(a.DemandTokens), f(a.AllowanceTokens), f(a.IdealTokens),
			f(a.AdmittedPerIdeal), f(a.AdmittedPerAllowance), f(a.AdmittedPerDemand), f(a.MaxKeyRatio), f(a.OvershootTokens),
			i(a.FalseDenied), f(a.FalseDenialRate),
			i(a.ExactTokens), f(a.AdmittedPerExact), i(a.OverExact), i(a.UnderExact), f(a.UnderExactRate),
			i(int64(l.P50)), i(int64(l.P99)), i(int64(l.P999)), i(int64(l.Max)),
		}
		if rc := res.Redis; rc != nil {
			row = append(row, rc.CountedBy, i(rc.ClientIssued), f(rc.PerThousand), i(rc.InScript), f(rc.InScriptPerThousand))
		} else {
			row = append(row, "", "", "", "", "")
		}
		if sy := res.Sync; sy != nil {
			row = append(row, i(sy.Flushes), i(sy.FlushedKeys), i(sy.Pipelines), i(int64(sy.PipelineLatency.P50)), i(int64(sy.PipelineLatency.P99)))
		} else {
			row = append(row, "", "", "", "", "")
		}
		if c := res.RedisCPU; c != nil {
			row = append(row, f(c.Seconds), f(c.MsPerThousand), f(c.MainThreadSeconds), f(c.MainThreadMsPerThousand))
		} else {
			row = append(row, "", "", "", "")
		}
		if len(res.Scripts) > 0 {
			var calls, usec int64
			for _, sc := range res.Scripts {
				calls += sc.Calls
				usec += sc.Usec
			}
			row = append(row, i(calls), f(ratio(float64(usec), float64(calls))))
		} else {
			row = append(row, "", "")
		}
		fd := res.First
		row = append(row, i(res.Local), f(res.LocalShare), i(fd.Keys), i(fd.Local), f(fd.LocalShare),
			f(fd.RedisCPUMsPerThousand), f(fd.RedisCmdsPerThousand))
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// errWriter remembers the first write error so a long report can be written without checks.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }
