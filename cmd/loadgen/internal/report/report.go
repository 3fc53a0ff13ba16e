// Package report holds the load generator's results and their arithmetic: the exact token-bucket
// allowance a run is compared with, accuracy ratios, latency percentiles and Redis command
// accounting, and the human table, JSON, CSV and SVG renderings of them.
//
// It does no I/O of its own beyond the io.Writer it is given, so every figure it prints can be
// tested with made-up tallies.
package report

import (
	"math"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Scenario describes the workload every mode of one run was given.
type Scenario struct {
	Name    string   `json:"name,omitempty"` // the --scenario preset; "" when none
	Modes   []string `json:"modes"`
	Backend string   `json:"backend"` // e.g. "redis standalone 127.0.0.1:16379" or "embedded miniredis"
	Nodes   int      `json:"nodes"`
	Keys    int      `json:"keys"`
	Pattern string   `json:"pattern"`
	ZipfS   float64  `json:"zipf_s,omitempty"`
	// Affinity is the share of each key's requests sent to its home node; nil when requests were not
	// routed by key (each worker kept one node).
	Affinity     *float64 `json:"affinity,omitempty"`
	Rate         float64  `json:"rate"`  // tokens per second per key
	Burst        int64    `json:"burst"` // bucket capacity per key
	Cost         int64    `json:"cost"`  // tokens per request
	Load         float64  `json:"load,omitempty"`
	TargetRPS    float64  `json:"target_rps"` // total requests per second aimed at; 0 = as fast as possible
	Duration     Duration `json:"duration"`   // per mode; 0 = until Requests
	Requests     int64    `json:"requests,omitempty"`
	Concurrency  int      `json:"concurrency"`
	Seed         uint64   `json:"seed"`
	SyncInterval Duration `json:"sync_interval"`
	Drift        float64  `json:"drift"`
	Policy       string   `json:"policy"`
	SyncTimeout  Duration `json:"sync_timeout"`
	GoVersion    string   `json:"go_version"`
	GOMAXPROCS   int      `json:"gomaxprocs"`
	NumCPU       int      `json:"num_cpu"`
	RedisVersion string   `json:"redis_version,omitempty"`
}

// Duration is a time.Duration that marshals to JSON as a string such as "20ms".
type Duration time.Duration

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// KeyTally is what one key saw during a run, in tokens.
type KeyTally struct {
	Admitted int64
	Demand   int64
}

// Allowance returns the most tokens an exact token bucket of rate tokens/s and capacity burst,
// full at the start, admits over elapsed: Burst + Rate·T.
func Allowance(rate float64, burst int64, elapsed time.Duration) float64 {
	return float64(burst) + rate*elapsed.Seconds()
}

// Accuracy compares what a limiter admitted with what an exact global token bucket per key could
// have admitted over the same time. Keys that saw no demand are left out.
type Accuracy struct {
	ActiveKeys      int     `json:"active_keys"`      // keys with demand
	AdmittedTokens  int64   `json:"admitted_tokens"`  // over all nodes
	DemandTokens    int64   `json:"demand_tokens"`    // requested, over all nodes
	AllowanceTokens float64 `json:"allowance_tokens"` // Σ (Burst + Rate·T) over active keys
	// IdealTokens is Σ min(demand, Burst + Rate·T): what an exact limiter admits at most. Under
	// overload it is the allowance; under honest load it is the demand.
	IdealTokens float64 `json:"ideal_tokens"`
	// AdmittedPerIdeal is the headline accuracy: 1 is exact, above 1 over-admits, below 1 under-admits.
	AdmittedPerIdeal     float64 `json:"admitted_per_ideal"`
	AdmittedPerAllowance float64 `json:"admitted_per_allowance"`
	AdmittedPerDemand    float64 `json:"admitted_per_demand"`
	// MaxKeyRatio is the largest admitted / (Burst + Rate·T) of any active key, and MaxKey that key.
	MaxKeyRatio float64 `json:"max_key_ratio"`
	MaxKey      int     `json:"max_key"`
	// OvershootTokens is Σ max(0, admitted − (Burst + Rate·T)) over keys: tokens admitted beyond any
	// exact limiter.
	OvershootTokens float64 `json:"overshoot_tokens"`
	// HonestKeys are the keys whose demand stayed within Burst + Rate·T. Tokens denied to them are
	// FalseDenied (an exact limiter fed smoothly would have admitted them), FalseDenialRate the
	// fraction of HonestDemand that was denied.
	HonestKeys      int     `json:"honest_keys"`
	HonestDemand    int64   `json:"honest_demand_tokens"`
	FalseDenied     int64   `json:"false_denied_tokens"`
	FalseDenialRate float64 `json:"false_denial_rate"`

	// The exact reference: one exact token bucket per key (full at the start) fed the very requests
	// the mode saw, at the times they were made, across all nodes. Oracle is false when the run had
	// too many requests to record them all.
	Oracle bool `json:"oracle"`
	// ExactTokens is what the exact buckets admitted; AdmittedPerExact is admitted ÷ ExactTokens.
	ExactTokens      int64   `json:"exact_tokens,omitempty"`
	AdmittedPerExact float64 `json:"admitted_per_exact,omitempty"`
	// OverExact is Σ per key max(0, admitted − exact): tokens admitted beyond the exact limiter.
	// UnderExact is Σ per key max(0, exact − admitted): tokens the exact limiter admitted and this
	// mode denied (false denials), and UnderExactRate that ÷ ExactTokens.
	OverExact      int64   `json:"over_exact_tokens,omitempty"`
	UnderExact     int64   `json:"under_exact_tokens,omitempty"`
	UnderExactRate float64 `json:"under_exact_rate,omitempty"`
}

// ExactAdmitted returns how many tokens an exact token bucket of rate tokens/s and capacity burst,
// full at time 0, admits for requests of cost tokens made at times (ns, ascending).
func ExactAdmitted(times []int64, rate float64, burst, cost int64) int64 {
	tokens := float64(burst)
	var last int64
	var admitted int64
	perNs := rate / 1e9
	for _, t := range times {
		if t > last {
			tokens = math.Min(float64(burst), tokens+float64(t-last)*perNs)
			last = t
		}
		if tokens >= float64(cost) {
			tokens -= float64(cost)
			admitted += cost
		}
	}
	return admitted
}

// AddExact fills in the exact reference from exact, the tokens an exact bucket admitted per key
// (indexed like the tallies a was computed from).
func (a *Accuracy) AddExact(keys []KeyTally, exact []int64) {
	a.Oracle = true
	a.ExactTokens, a.OverExact, a.UnderExact = 0, 0, 0
	for k, e := range exact {
		a.ExactTokens += e
		if d := keys[k].Admitted - e; d > 0 {
			a.OverExact += d
		} else {
			a.UnderExact -= d
		}
	}
	a.AdmittedPerExact = ratio(float64(a.AdmittedTokens), float64(a.ExactTokens))
	a.UnderExactRate = ratio(float64(a.UnderExact), float64(a.ExactTokens))
}

// ComputeAccuracy computes the accuracy of a run that lasted elapsed, from per-key tallies indexed by
// key number, under a limit of rate tokens/s and burst tokens per key.
func ComputeAccuracy(keys []KeyTally, rate float64, burst int64, elapsed time.Duration) Accuracy {
	a := Accuracy{MaxKey: -1}
	allow := Allowance(rate, burst, elapsed)
	for k, t := range keys {
		if t.Demand <= 0 {
			continue
		}
		a.ActiveKeys++
		a.AdmittedTokens += t.Admitted
		a.DemandTokens += t.Demand
		a.AllowanceTokens += allow
		a.IdealTokens += math.Min(float64(t.Demand), allow)
		if r := float64(t.Admitted) / allow; a.MaxKey < 0 || r > a.MaxKeyRatio {
			a.MaxKeyRatio, a.MaxKey = r, k
		}
		if over := float64(t.Admitted) - allow; over > 0 {
			a.OvershootTokens += over
		}
		if float64(t.Demand) <= allow {
			a.HonestKeys++
			a.HonestDemand += t.Demand
			a.FalseDenied += t.Demand - t.Admitted
		}
	}
	a.AdmittedPerIdeal = ratio(float64(a.AdmittedTokens), a.IdealTokens)
	a.AdmittedPerAllowance = ratio(float64(a.AdmittedTokens), a.AllowanceTokens)
	a.AdmittedPerDemand = ratio(float64(a.AdmittedTokens), float64(a.DemandTokens))
	a.FalseDenialRate = ratio(float64(a.FalseDenied), float64(a.HonestDemand))
	return a
}

// ratio returns num/den, or 0 when den is 0.
func ratio(num, den float64) float64 {
	if den == 0 {
		return 0
	}
	return num / den
}

// PerThousand returns how many of n happen per 1,000 of per (0 when per is 0).
func PerThousand(n, per int64) float64 { return ratio(1000*float64(n), float64(per)) }

// Latency summarises a latency distribution.
type Latency struct {
	Count int64    `json:"count"`
	Mean  Duration `json:"mean"`
	P50   Duration `json:"p50"`
	P99   Duration `json:"p99"`
	P999  Duration `json:"p99_9"`
	Max   Duration `json:"max"`
}

// NewHistogram returns a histogram for latencies in nanoseconds from 1ns to 100s with three
// significant digits: the error of any percentile is below 0.1%.
func NewHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, int64(100*time.Second), 3)
}

// Record adds d to h, clamped to h's range.
func Record(h *hdrhistogram.Histogram, d time.Duration) {
	v := int64(d)
	v = max(v, h.LowestTrackableValue())
	v = min(v, h.HighestTrackableValue())
	_ = h.RecordValue(v) // cannot fail: v is in range
}

// LatencyOf summarises h. max is the exact maximum when the caller tracked it (the histogram's own
// is rounded up to its precision); pass 0 to use the histogram's.
func LatencyOf(h *hdrhistogram.Histogram, exactMax time.Duration) Latency {
	if h == nil || h.TotalCount() == 0 {
		return Latency{}
	}
	l := Latency{
		Count: h.TotalCount(),
		Mean:  Duration(math.Round(h.Mean())),
		P50:   Duration(h.ValueAtQuantile(50)),
		P99:   Duration(h.ValueAtQuantile(99)),
		P999:  Duration(h.ValueAtQuantile(99.9)),
		Max:   Duration(h.Max()),
	}
	if exactMax > 0 {
		l.Max = Duration(exactMax)
	}
	return l
}

// Timeline is admitted and demanded tokens per time bin, from the start of a mode's run.
type Timeline struct {
	Bin      Duration `json:"bin"`
	Admitted []int64  `json:"admitted"`
	Demand   []int64  `json:"demand"`
}

// Rates returns the admitted rate of each bin in tokens per second, for the bins that elapsed at
// least half covers: the last, partial bin is scaled by the part of it that elapsed, or left out
// when that part is under half a bin (too few requests to say anything).
func (t Timeline) Rates(elapsed time.Duration) []float64 {
	bin := time.Duration(t.Bin)
	if bin <= 0 {
		return nil
	}
	out := make([]float64, 0, len(t.Admitted))
	for i, a := range t.Admitted {
		from := time.Duration(i) * bin
		width := min(bin, elapsed-from)
		if width < bin/2 {
			break
		}
		out = append(out, float64(a)/width.Seconds())
	}
	return out
}

// Sources counts hybrid decisions by who made them (hybrid.Stats).
type Sources struct {
	Local           int64 `json:"local"`
	LocalDenied     int64 `json:"local_denied"`
	Central         int64 `json:"central"`
	CentralDenied   int64 `json:"central_denied"`
	DenyCache       int64 `json:"deny_cache"`
	FallbackAllowed int64 `json:"fallback_allowed"`
	FallbackDenied  int64 `json:"fallback_denied"`
}

// Total returns the number of decisions counted.
func (s Sources) Total() int64 {
	return s.Local + s.LocalDenied + s.Central + s.CentralDenied + s.DenyCache + s.FallbackAllowed + s.FallbackDenied
}

// Sync describes the background reconcile work of a hybrid fleet.
type Sync struct {
	Flushes     int64 `json:"flushes"`      // reconcile rounds, all nodes (hybrid.Stats.Flushes)
	FlushedKeys int64 `json:"flushed_keys"` // keys sent in them
	FailedKeys  int64 `json:"failed_keys"`
	// Pipelines and PipelineLatency are the Redis pipelines the nodes' clients sent (each reconcile
	// round is one pipeline per Redis node), timed by a go-redis hook around the round trip.
	Pipelines       int64   `json:"pipelines"`
	PipelineLatency Latency `json:"pipeline_latency"`
	// LibraryCommands is the script calls the limiters say they sent (hybrid.Stats.RedisCommands),
	// a cross-check of the server's count.
	LibraryCommands int64 `json:"library_commands"`
	RedisErrors     int64 `json:"redis_errors"`
	Unrecorded      int64 `json:"unrecorded_tokens"`
}

// Result is one mode's outcome.
type Result struct {
	Mode    string   `json:"mode"`
	Partial bool     `json:"partial,omitempty"` // interrupted before its duration or request count
	Elapsed Duration `json:"elapsed"`

	Decisions       int64   `json:"decisions"` // answered requests
	Allowed         int64   `json:"allowed"`   // allowed requests
	Errors          int64   `json:"errors"`    // requests that got an error instead of a decision
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	TargetRPS       float64 `json:"target_rps"` // 0 = as fast as possible
	AchievedRPS     float64 `json:"achieved_rps"`
	// Local is the decisions made without a Redis round trip on the caller's path (for hybrid: its
	// local allowance, a local denial or its deny cache), and LocalShare that ÷ Decisions.
	Local      int64   `json:"local_decisions"`
	LocalShare float64 `json:"local_share"`
	// First is the first decision the fleet made on each key: a key new to the limiters.
	First FirstDecisions `json:"first_decisions"`

	Accuracy Accuracy  `json:"accuracy"`
	Latency  Latency   `json:"latency"`
	Redis    *Commands `json:"redis,omitempty"` // nil for modes that use no Redis
	// RedisCPU is the CPU time the whole Redis server used during the run (INFO cpu), whoever asked
	// for it; nil for modes that use no Redis and on the embedded miniredis, which keeps none.
	RedisCPU *RedisCPU    `json:"redis_cpu,omitempty"`
	Scripts  []ScriptStat `json:"scripts,omitempty"` // script commands' time, from INFO commandstats
	Sources  *Sources     `json:"sources,omitempty"`
	Sync     *Sync        `json:"sync,omitempty"`
	Timeline Timeline     `json:"timeline"`
	Notes    []string     `json:"notes,omitempty"`
}

// FirstDecisions describes the first decision the fleet made on each key of a run, a key the
// limiters had never seen: what the churn scenario measures. When two nodes decide a new key at
// once, the one that records it first counts.
type FirstDecisions struct {
	Keys       int64   `json:"keys"`    // distinct keys decided
	Local      int64   `json:"local"`   // their first decisions made without a Redis round trip
	Allowed    int64   `json:"allowed"` // their first decisions that allowed
	LocalShare float64 `json:"local_share"`
	// What the whole mode cost Redis per 1,000 new keys: every decision's share, the repeat and hot
	// keys' included, so an upper bound on the cost of a new key. 0 when not measured.
	RedisCPUMsPerThousand float64 `json:"redis_cpu_ms_per_1000_keys,omitempty"`
	RedisCmdsPerThousand  float64 `json:"redis_cmds_per_1000_keys,omitempty"`
}

// Report is everything one run produced; it is what --json writes.
type Report struct {
	Scenario    Scenario  `json:"scenario"`
	Started     time.Time `json:"started"`
	Interrupted bool      `json:"interrupted,omitempty"`
	Results     []Result  `json:"results"`
	// Verdict is Judge of the rest of the report, filled in before it is written.
	Verdict *Verdict `json:"verdict,omitempty"`
}
