// Package fleetsim is the fleet simulator of cmd/loadgen (--fleet): it runs N nodes, each a real
// hybrid.Limiter with its real local store and syncer, on virtual time against one real
// redis-server running the real scripts, for N up to thousands, and the same requests against a
// central Lua token bucket on the same server. Redis's CPU is measured (INFO cpu), not modelled.
//
// # How time works
//
// Every node's clocks (the monotonic clock of leases and retries, the wall clock) and the time its
// scripts run at (reconcile.lua's time override instead of Redis TIME) follow one virtual clock
// (internal/virtual). The loop takes the next event in time order: a request (one AllowN on its
// node, timed on the real clock: that is the latency a caller sees, local or a Redis round trip)
// or a sync tick (every node's background round, the work its loop does each SyncInterval, run on
// a few goroutines at once). So 4,096 nodes cost one loop, not 4,096 timers, and the run takes as
// long as its Redis calls and decisions take. The central bucket runs the same requests at the
// same virtual times (its script takes the time as an argument too), one call per decision: it is
// also the exact reference (a strict token bucket on the same clock).
//
// # What it does not model
//
// Requests are decided one at a time: a node's concurrent callers sharing one synchronous call are
// not modelled, and a Redis round trip is measured on an otherwise idle connection (no queueing
// behind other nodes' rounds). Network latency between a node and Redis is loopback's.
package fleetsim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/peers"
	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/report"
	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/workload"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/virtual"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/relay"
)

// Probe reads the Redis server's counters: its CPU time in seconds (user + system, INFO cpu) and
// the script calls it ran (EVALSHA and EVAL, INFO commandstats).
type Probe func(ctx context.Context) (cpu float64, calls int64, err error)

// Config is one simulator run.
type Config struct {
	Client *redis.Client // the nodes' and the central bucket's Redis (shared pool)
	// Probe reads Redis's CPU and script calls; nil measures neither (the tests, which check
	// accuracy only): Redis CPU and calls read 0, and the central bucket runs once per scenario,
	// as the exact reference, instead of on both sides of each row.
	Probe     Probe
	Fleet     []int         // node counts
	Scenarios []Scenario    // workloads
	Duration  time.Duration // virtual time per scenario and node count
	Warmup    time.Duration // virtual time before the cost, latency and local-share window opens
	Seed      uint64
	// Relay, if positive, puts a relay (package relay) in front of every Relay nodes: the nodes'
	// leases come from their relay, and Redis sees the relays (ceil(N/Relay) of them). The relays
	// run in the simulator's process on the same virtual clock, stepped after their nodes in every
	// tick; a node's call to its relay costs no network round trip here (see Result.Relays).
	Relay int
	// Relays, if positive (and Relay is 0), puts the nodes behind this many relays at every fleet
	// size (ceil(N/Relays) nodes each).
	Relays int
	// Shard, with relays, sends each key to one relay (relay.Sharded: its owner, by rendezvous
	// hashing of the key) instead of each node to the relay of its group.
	Shard bool
	// IdleCPU is the server's own CPU per real second when idle (its cron), subtracted from every
	// window's Redis CPU; measure it with MeasureIdle.
	IdleCPU float64
	// Flush, if not nil, is called between runs to drop the previous run's keys (a server the
	// simulator started itself); nil leaves them to expire.
	Flush func(ctx context.Context) error
	// Progress, if not nil, receives a line as each run starts and ends.
	Progress func(string)
}

// Result is one scenario at one node count: hybrid's figures and the central bucket's on the same
// requests.
type Result struct {
	Scenario string `json:"scenario"`
	Nodes    int    `json:"nodes"`
	// Relays is how many relays the nodes' leases came through (0: none, every node talks to
	// Redis). With relays, a decision that is not local is a call to the node's relay, in process:
	// on a real host add a loopback round trip to its latency.
	Relays int `json:"relays"`
	// Sharded: each key went through one relay, its owner (Config.Shard), not each node through
	// the relay of its group.
	Sharded bool `json:"sharded,omitempty"`

	Decisions int64   `json:"decisions"`   // in the window (after warm-up)
	Local     float64 `json:"local_share"` // of the window's decisions, made with no Redis call on the caller's path
	// Fallback is the share of the window's decisions the failure policy made (a Redis call that
	// failed or timed out at the check timeout, or the breaker open).
	Fallback float64 `json:"fallback_share"`
	// Redis calls (script calls, as Redis counts them) and CPU (µs, net of the idle server) per
	// 1,000 decisions in the window; KeyCalls is the keys the limiters sent (reconciles and
	// synchronous takes) per 1,000 decisions over the whole run, from their own counters.
	Calls    float64 `json:"redis_calls_per_1k"`
	KeyCalls float64 `json:"key_calls_per_1k"`
	CPU      float64 `json:"redis_cpu_us_per_1k"`
	Rounds   float64 `json:"rounds_per_s"` // background rounds that sent something, per virtual second, whole fleet
	// FailedSteps is how many of the fleet's background steps had a round that failed (a Redis
	// timeout on a loaded machine, most often), over the whole run. A failed round is not fatal,
	// as in production: its keys stay pending for the node's next round, and the run goes on.
	FailedSteps int64 `json:"failed_steps"`

	CentralCalls float64 `json:"central_calls_per_1k"`
	CentralCPU   float64 `json:"central_cpu_us_per_1k"` // the mean of the runs just before and after
	CPURatio     float64 `json:"cpu_ratio"`             // CPU ÷ CentralCPU
	// CentralCPUBefore and CentralCPUAfter are the central bucket's runs just before and just after
	// this row's hybrid run (µs per 1,000 decisions): how far the machine moved meanwhile.
	CentralCPUBefore float64 `json:"central_cpu_before_us_per_1k"`
	CentralCPUAfter  float64 `json:"central_cpu_after_us_per_1k"`

	// Accuracy over the whole run: the worst key's admitted ÷ (Burst + Rate·T), admitted ÷ what the
	// exact bucket admitted, and false denials: tokens the exact bucket admitted and hybrid denied,
	// per key, ÷ the exact bucket's tokens (UnderExact), and denials of keys whose demand stayed
	// within Burst + Rate·T ÷ their demand (FalseDenied).
	WorstKey    float64 `json:"worst_key_per_allowance"`
	PerExact    float64 `json:"admitted_per_exact"`
	UnderExact  float64 `json:"under_exact"`
	FalseDenied float64 `json:"false_denied"`

	// Latency a caller sees (real time of AllowN, ns), hybrid and central, in the window.
	P50, P99, P999    int64 `json:"-"`
	CP50, CP99, CP999 int64 `json:"-"`
	// The same in µs, for the outputs (the central bucket's p99 only).
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	P999us float64 `json:"p999_us"`
	CP99us float64 `json:"central_p99_us"`
	// Wall is the real time the hybrid run took (WallSeconds in the outputs).
	Wall        time.Duration `json:"-"`
	WallSeconds float64       `json:"wall_s"`
	// RedisPerDecisionShare is 1 − Local: the share of decisions with a Redis call on the caller's
	// path, or decided by the failure policy.
	RedisPerDecisionShare float64 `json:"redis_path_share"`
}

// MeasureIdle returns the server's CPU per real second while nothing talks to it (its cron).
func MeasureIdle(ctx context.Context, probe Probe, over time.Duration) (float64, error) {
	c0, _, err := probe(ctx)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(over):
	}
	c1, _, err := probe(ctx)
	if err != nil {
		return 0, err
	}
	return max(c1-c0, 0) / time.Since(start).Seconds(), nil
}

// arrival is one request: when (virtual ns since the start), which key, which node.
type arrival struct {
	at   int64
	key  int32
	node int32
}

// arrivals generates the scenario's requests over d for n nodes: a Poisson stream at the
// scenario's total rate, keys by its pattern, nodes by its routing. The same seed gives the same
// keys and times whatever n is; only the nodes differ.
func arrivals(s Scenario, n int, d time.Duration, seed uint64) ([]arrival, error) {
	rng := rand.New(rand.NewPCG(seed, 1))
	var pk *workload.Picker
	var err error
	switch s.Pattern {
	case workload.Churn:
		pk, err = workload.NewChurnPicker(s.Keys, seed^2, 0, 1)
	case workload.Zipf:
		pk, err = workload.NewPicker(workload.Zipf, s.Keys, s.ZipfS, seed, 2)
	default:
		pk, err = workload.NewPicker(workload.Uniform, s.Keys, 0, seed, 2)
	}
	if err != nil {
		return nil, err
	}
	nodes := n
	if s.Moving && n >= 2 {
		nodes = n / 2
	}
	rt, err := workload.NewRouter(nodes, s.Affinity, seed, 3)
	if err != nil {
		return nil, err
	}
	rps := s.totalRPS()
	out := make([]arrival, 0, int(rps*d.Seconds()*1.05)+16)
	t := 0.0
	for {
		t += rng.ExpFloat64() / rps
		at := int64(t * 1e9)
		if at >= int64(d) {
			return out, nil
		}
		k := pk.Next()
		node := rt.Node(k)
		if s.Moving && n >= 2 && at >= int64(d)/2 {
			node += nodes
		}
		out = append(out, arrival{at: at, key: int32(k), node: int32(node)})
	}
}

// clock is the virtual clock: ns since origin.
type clock struct {
	origin time.Time
	ns     atomic.Int64
}

func (c *clock) now() time.Time { return c.origin.Add(time.Duration(c.ns.Load())) }

// keyName is the limiter key of key number k.
func keyName(k int32) string { return fmt.Sprintf("u%d", k) }

// Run runs every scenario at every fleet size and returns the results in that order. A scenario's
// central bucket runs before its first fleet size and again after each: its cost does not depend
// on the nodes, but the machine's other load moves over the minutes a table takes, so each row
// compares its hybrid run with the mean of the central runs on either side of it.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	var out []Result
	for si, s := range cfg.Scenarios {
		arr0, err := arrivals(s, 1, cfg.Duration, cfg.Seed+uint64(si))
		if err != nil {
			return out, err
		}
		cen, err := runCentral(ctx, cfg, s, arr0, fmt.Sprintf("fsc%d%d:", si, cfg.Seed))
		if err != nil {
			return out, fmt.Errorf("%s: central: %w", s.Name, err)
		}
		for fi, n := range cfg.Fleet {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			if cfg.Progress != nil {
				cfg.Progress(fmt.Sprintf("%s, %d nodes: running %v of virtual time", s.Name, n, cfg.Duration))
			}
			arr, err := arrivals(s, n, cfg.Duration, cfg.Seed+uint64(si))
			if err != nil {
				return out, err
			}
			r, err := runHybrid(ctx, cfg, s, n, arr, fmt.Sprintf("fs%d%d%d", si, n, cfg.Seed))
			if err != nil {
				return out, fmt.Errorf("%s, %d nodes: %w", s.Name, n, err)
			}
			// The central bucket again, right after: the row's central cost is the mean of the runs
			// just before and just after its hybrid run, so that a machine whose other load changes
			// over the minutes a table takes shifts both sides alike. (The central bucket's cost
			// per decision moved by 2× between one scenario's runs on a shared machine.)
			after := cen
			if cfg.Probe != nil {
				if after, err = runCentral(ctx, cfg, s, arr0, fmt.Sprintf("fsc%d%d_%d:", si, cfg.Seed, fi)); err != nil {
					return out, fmt.Errorf("%s: central: %w", s.Name, err)
				}
			}
			before := cen
			cen.calls, cen.cpu = (before.calls+after.calls)/2, (before.cpu+after.cpu)/2
			r.CentralCPUBefore, r.CentralCPUAfter = before.cpu, after.cpu
			r.CentralCalls, r.CentralCPU, r.CP50, r.CP99, r.CP999 = cen.calls, cen.cpu, cen.p50, cen.p99, cen.p999
			cen.calls, cen.cpu = after.calls, after.cpu // the next row's "before"
			r.CP99us = float64(cen.p99) / 1e3
			r.CPURatio = ratio(r.CPU, cen.cpu)
			r.PerExact = ratio(float64(r.admitted), float64(cen.exactTotal))
			r.UnderExact = underExact(r.perKey, cen.exact)
			out = append(out, r.Result)
			if cfg.Progress != nil {
				cfg.Progress(fmt.Sprintf("%s, %d nodes: local %.2f%%, Redis CPU %.3f× central, worst key %.3f, took %v",
					s.Name, n, 100*r.Local, r.CPURatio, r.WorstKey, r.Wall.Round(time.Millisecond)))
			}
			if cfg.Flush != nil {
				if err := cfg.Flush(ctx); err != nil {
					return out, err
				}
			}
		}
	}
	return out, nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// underExact is Σ per key max(0, exact − admitted) ÷ Σ exact.
func underExact(admitted, exact []int64) float64 {
	var under, total int64
	for k, e := range exact {
		total += e
		if d := e - admitted[k]; d > 0 {
			under += d
		}
	}
	return ratio(float64(under), float64(total))
}

// centralResult is the central bucket's run of a scenario.
type centralResult struct {
	calls, cpu       float64 // per 1,000 decisions in the window
	p50, p99, p999   int64
	exact            []int64 // tokens admitted per key over the whole run
	exactTotal       int64
	checkedAgainstGo bool
}

// window measures Redis between the end of the warm-up and the end of a run.
type window struct {
	cpu0   float64
	calls0 int64
	wall0  time.Time
	open   bool
}

func (w *window) start(ctx context.Context, p Probe) error {
	if p == nil {
		w.wall0, w.open = time.Now(), true
		return nil
	}
	cpu, calls, err := p(ctx)
	w.cpu0, w.calls0, w.wall0, w.open = cpu, calls, time.Now(), true
	return err
}

// end returns the window's Redis CPU (µs, net of the idle server) and script calls.
func (w *window) end(ctx context.Context, p Probe, idle float64) (cpuMicros float64, calls int64, err error) {
	if p == nil {
		return 0, 0, nil
	}
	cpu, c, err := p(ctx)
	if err != nil {
		return 0, 0, err
	}
	net := cpu - w.cpu0 - idle*time.Since(w.wall0).Seconds()
	return max(net, 0) * 1e6, c - w.calls0, nil
}

func runCentral(ctx context.Context, cfg Config, s Scenario, arr []arrival, prefix string) (centralResult, error) {
	var r centralResult
	st, err := peers.NewStrict(cfg.Client, s.Rate, s.Burst)
	if err != nil {
		return r, err
	}
	names := make(map[int32]string)
	origin := time.Now()
	hist := hdrhistogram.New(1, int64(10*time.Second), 3)
	r.exact = make([]int64, s.Keys)
	var w window
	var decisions int64
	for _, a := range arr {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		if !w.open && a.at >= int64(cfg.Warmup) {
			if err := w.start(ctx, cfg.Probe); err != nil {
				return r, err
			}
		}
		name, ok := names[a.key]
		if !ok {
			name = peers.StrictKey(prefix, keyName(a.key))
			names[a.key] = name
		}
		t0 := time.Now()
		res, err := st.AllowAt(ctx, name, 1, origin.Add(time.Duration(a.at)).UnixMicro())
		lat := time.Since(t0)
		if err != nil {
			return r, err
		}
		if res.Allowed {
			r.exact[a.key]++
			r.exactTotal++
		}
		if w.open {
			decisions++
			_ = hist.RecordValue(max(int64(lat), 1))
		}
	}
	if !w.open {
		return r, fmt.Errorf("the run is not longer than its warm-up")
	}
	cpu, calls, err := w.end(ctx, cfg.Probe, cfg.IdleCPU)
	if err != nil {
		return r, err
	}
	r.cpu = 1000 * cpu / float64(max(decisions, 1))
	r.calls = 1000 * float64(calls) / float64(max(decisions, 1))
	r.p50, r.p99, r.p999 = hist.ValueAtQuantile(50), hist.ValueAtQuantile(99), hist.ValueAtQuantile(99.9)
	// The central bucket is the exact reference: check it against report's exact bucket, per key.
	times := make([][]int64, s.Keys)
	for _, a := range arr {
		times[a.key] = append(times[a.key], a.at)
	}
	for k, ts := range times {
		if len(ts) == 0 {
			continue
		}
		if want := report.ExactAdmitted(ts, s.Rate, s.Burst, 1); absDiff(want, r.exact[k]) > 1 {
			return r, fmt.Errorf("key %d: the central bucket admitted %d, an exact bucket %d", k, r.exact[k], want)
		}
	}
	r.checkedAgainstGo = true
	if cfg.Flush != nil {
		return r, cfg.Flush(ctx)
	}
	return r, nil
}

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}

// hybridResult is a Result with what Run needs to compare it with the central run.
type hybridResult struct {
	Result
	perKey   []int64
	admitted int64
}

// stepWorkers is how many goroutines run the nodes' background rounds of one tick.
const stepWorkers = 16

func runHybrid(ctx context.Context, cfg Config, s Scenario, n int, arr []arrival, prefix string) (hybridResult, error) {
	var r hybridResult
	r.Scenario, r.Nodes = s.Name, n
	clk := &clock{origin: time.Now()}
	opt := virtual.Option(clk.now).(hybrid.Option)
	lims := make([]*hybrid.Limiter, n)
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, l := range lims {
			if l != nil {
				_ = l.Close(cctx)
			}
		}
	}()
	var relays []*relay.Relay
	group := cfg.Relay
	if group <= 0 && cfg.Relays > 0 {
		group = (n + cfg.Relays - 1) / cfg.Relays
	}
	if group > 0 {
		nr := (n + group - 1) / group
		r.Relays = nr
		for i := range nr {
			cc := relay.ClientConfig(cfg.Client, prefix, fmt.Sprintf("relay%d", i))
			cc.ScriptNow = func() int64 { return clk.now().UnixMicro() }
			// The fleet's size, as the registry would count it (the nodes join it; the relays'
			// own heartbeats are not simulated).
			ro := []relay.Option{relay.WithInterval(hybrid.DefaultSyncInterval),
				relay.WithFleet(func() int64 { return int64(n) }), relay.WithClock(func() int64 { return clk.ns.Load() + 1 })}
			if cfg.Shard {
				ro = append(ro, relay.WithColdCredit(1)) // each key reaches Redis through its owner only
			}
			rl, err := relay.New(cc, ro...)
			if err != nil {
				return r, err
			}
			relays = append(relays, rl)
		}
	}
	var sharded *relay.Sharded
	if relays != nil && cfg.Shard {
		m := make(map[string]relay.Upstream, len(relays))
		for i, rl := range relays {
			m[fmt.Sprintf("relay%d", i)] = rl
		}
		var err error
		if sharded, err = relay.NewSharded(m); err != nil {
			return r, err
		}
		r.Sharded = true
	}
	for i := range lims {
		opts := []hybrid.Option{opt, hybrid.WithKeyPrefix(prefix)}
		switch {
		case sharded != nil:
			opts = append(opts, hybrid.WithUpstream(sharded))
		case relays != nil:
			opts = append(opts, hybrid.WithUpstream(relays[i/group]))
		}
		l, err := hybrid.New(cfg.Client, opts...)
		if err != nil {
			return r, err
		}
		lims[i] = l
	}
	limit := hybrid.Limit{Rate: s.Rate, Burst: s.Burst}
	interval := int64(hybrid.DefaultSyncInterval)
	names := make([]string, s.Keys)
	r.perKey = make([]int64, s.Keys)
	demand := make([]int64, s.Keys)
	hist := hdrhistogram.New(1, int64(10*time.Second), 3)
	var w window
	var decisions, local, fallback int64
	var rounds0 int64
	start := time.Now()
	nextTick := interval
	step := func() error {
		var wg sync.WaitGroup
		errs := make([]error, stepWorkers)
		for g := range stepWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < n; i += stepWorkers {
					if err := virtual.Step(ctx, lims[i]); err != nil && errs[g] == nil {
						errs[g] = err
					}
				}
			}()
		}
		wg.Wait()
		// The relays' rounds, after their nodes' (whose renewals they answered from their pools).
		for g := range min(stepWorkers, len(relays)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < len(relays); i += stepWorkers {
					if err := relays[i].Tick(ctx); err != nil && errs[g] == nil {
						errs[g] = err
					}
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	rounds := func() int64 {
		var t int64
		for _, l := range lims {
			t += l.Stats().Flushes
		}
		return t
	}
	// Every node runs its first background round (its first fleet-registry heartbeat) before the
	// traffic starts, as a readiness check lets a process take traffic once it has started; a node's
	// first milliseconds before its heartbeat's answer are docs/accuracy.md's "fleet registry"
	// assumption, not a steady state.
	if err := step(); err != nil {
		return r, fmt.Errorf("background round: %w", err)
	}
	ai := 0
	for {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		var a *arrival
		if ai < len(arr) {
			a = &arr[ai]
		}
		if a == nil && nextTick >= int64(cfg.Duration) {
			break
		}
		if a == nil || nextTick <= a.at {
			clk.ns.Store(nextTick)
			if err := step(); err != nil {
				if r.FailedSteps == 0 && cfg.Progress != nil {
					cfg.Progress(fmt.Sprintf("%s, %d nodes: a background round failed (counted in failed_steps; the run goes on): %v", s.Name, n, err))
				}
				r.FailedSteps++
			}
			nextTick += interval
			continue
		}
		ai++
		clk.ns.Store(a.at)
		if !w.open && a.at >= int64(cfg.Warmup) {
			if err := w.start(ctx, cfg.Probe); err != nil {
				return r, err
			}
			rounds0 = rounds()
		}
		if names[a.key] == "" {
			names[a.key] = keyName(a.key)
		}
		t0 := time.Now()
		d, err := lims[a.node].Decide(ctx, names[a.key], limit)
		lat := time.Since(t0)
		if err != nil {
			return r, err
		}
		demand[a.key]++
		if d.Allowed {
			r.perKey[a.key]++
			r.admitted++
		}
		if w.open {
			decisions++
			switch d.Source {
			case outcome.SourceLocal, outcome.SourceDenyCache:
				local++
			case outcome.SourceFallback:
				fallback++
			}
			_ = hist.RecordValue(max(int64(lat), 1))
		}
	}
	r.Wall = time.Since(start)
	r.WallSeconds = r.Wall.Seconds()
	if !w.open {
		return r, fmt.Errorf("the run is not longer than its warm-up")
	}
	var keyCalls int64
	if relays == nil {
		for _, l := range lims {
			st := l.Stats()
			keyCalls += st.FlushedKeys + st.Central + st.CentralDenied
		}
	}
	for _, rl := range relays {
		keyCalls += rl.Stats().Upstream
	}
	cpu, calls, err := w.end(ctx, cfg.Probe, cfg.IdleCPU)
	if err != nil {
		return r, err
	}
	window := (cfg.Duration - cfg.Warmup).Seconds()
	r.Rounds = float64(rounds()-rounds0) / window
	r.Decisions = decisions
	r.Local = ratio(float64(local), float64(decisions))
	r.Fallback = ratio(float64(fallback), float64(decisions))
	r.RedisPerDecisionShare = 1 - r.Local
	r.Calls = 1000 * float64(calls) / float64(max(decisions, 1))
	r.KeyCalls = 1000 * float64(keyCalls) / float64(len(arr)) // whole run: the limiters' counters
	r.CPU = 1000 * cpu / float64(max(decisions, 1))
	r.P50, r.P99, r.P999 = hist.ValueAtQuantile(50), hist.ValueAtQuantile(99), hist.ValueAtQuantile(99.9)
	r.P50us, r.P99us, r.P999us = float64(r.P50)/1e3, float64(r.P99)/1e3, float64(r.P999)/1e3
	allowance := float64(s.Burst) + s.Rate*cfg.Duration.Seconds()
	var honestDemand, honestDenied int64
	for k, adm := range r.perKey {
		if demand[k] == 0 {
			continue
		}
		r.WorstKey = math.Max(r.WorstKey, float64(adm)/allowance)
		if float64(demand[k]) <= allowance {
			honestDemand += demand[k]
			honestDenied += demand[k] - adm
		}
	}
	r.FalseDenied = ratio(float64(honestDenied), float64(honestDemand))
	return r, nil
}

// sortResults orders results by scenario (in Scenarios order) and nodes.
func sortResults(rs []Result) {
	order := map[string]int{}
	for i, s := range Scenarios {
		order[s.Name] = i
	}
	sort.SliceStable(rs, func(i, j int) bool {
		if rs[i].Scenario != rs[j].Scenario {
			return order[rs[i].Scenario] < order[rs[j].Scenario]
		}
		return rs[i].Nodes < rs[j].Nodes
	})
}
