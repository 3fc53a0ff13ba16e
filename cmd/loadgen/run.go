package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/report"
	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/workload"
)

// sharedTallyLimit is the largest keys × workers for which every worker keeps its own per-key
// counters; above it the workers share atomic counters (less memory, some contention).
const sharedTallyLimit = 1 << 22

// publishEvery is how many requests a worker makes between updates of its progress counters.
const publishEvery = 256

// maxRecords is the most requests a mode records (16 bytes each) to replay through an exact token
// bucket afterwards; a run with more falls back to a cruder comparison.
const maxRecords = 1 << 23

// request is one recorded request: when it was made (ns since the start) and for which key.
type request struct {
	t int64
	k int32
}

// worker makes its share of the demand: on one node, or with --affinity on the node its router picks
// for each request's key.
type worker struct {
	node   node             // this worker's node, when router is nil
	nodes  []node           // the fleet, for router
	router *workload.Router // nil: every request goes to node
	picker *workload.Picker
	pacer  *workload.Pacer
	cost   int64
	budget int64 // requests left; -1 = no limit

	adm, dem []int64      // per key, tokens; nil when shared is used
	shared   *sharedTally // per key, tokens, shared by all workers

	hist   *hdrhistogram.Histogram
	maxLat time.Duration

	bin            time.Duration
	binAdm, binDem []int64

	decisions, allowed, errs int64
	local                    int64 // decisions made without a Redis round trip
	pub                      published

	seen                         *keySet // keys some worker has had a decision on
	firsts, firstLocal, firstAdm int64   // the first decisions on a key that this worker recorded

	rec     []request // every request, in time order, up to recCap
	recCap  int
	recFull bool
}

// published is what the progress line reads while the worker runs.
type published struct {
	decisions, admitted, demand atomic.Int64
	_                           [40]byte
}

type sharedTally struct {
	adm, dem []atomic.Int64
}

// run makes requests until stop is set or the budget is spent.
func (w *worker) run(ctx context.Context, start time.Time, stop *atomic.Bool) {
	var admitted, demand int64
	for i := 0; w.budget != 0 && !stop.Load(); i++ {
		now := time.Since(start)
		if wait := w.pacer.Next(now); wait > 0 {
			sleep(wait, stop)
			continue
		}
		k := w.picker.Next()
		n := w.node
		if w.router != nil {
			n = w.nodes[w.router.Node(k)]
		}
		ok, local, err := n.allow(ctx, k, now)
		lat := time.Since(start) - now
		if w.budget > 0 {
			w.budget--
		}
		if len(w.rec) < w.recCap {
			w.rec = append(w.rec, request{t: int64(now), k: int32(k)})
		} else {
			w.recFull = true
		}
		b := int(now / w.bin)
		for b >= len(w.binDem) {
			w.binAdm = append(w.binAdm, 0)
			w.binDem = append(w.binDem, 0)
		}
		w.binDem[b] += w.cost
		demand += w.cost
		if w.shared != nil {
			w.shared.dem[k].Add(w.cost)
		} else {
			w.dem[k] += w.cost
		}
		if err != nil {
			w.errs++
		} else {
			w.decisions++
			if local {
				w.local++
			}
			if w.seen.add(k) {
				w.firsts++
				if local {
					w.firstLocal++
				}
				if ok {
					w.firstAdm++
				}
			}
			report.Record(w.hist, lat)
			w.maxLat = max(w.maxLat, lat)
			if ok {
				w.allowed++
				admitted += w.cost
				w.binAdm[b] += w.cost
				if w.shared != nil {
					w.shared.adm[k].Add(w.cost)
				} else {
					w.adm[k] += w.cost
				}
			}
		}
		if i%publishEvery == 0 {
			w.publish(admitted, demand)
		}
	}
	w.publish(admitted, demand)
}

// keySet is a set of key numbers, safe for concurrent use.
type keySet struct{ words []atomic.Uint64 }

func newKeySet(keys int) *keySet { return &keySet{words: make([]atomic.Uint64, (keys+63)/64)} }

// add adds k and reports whether it was new.
func (s *keySet) add(k int) bool {
	bit := uint64(1) << (k % 64)
	w := &s.words[k/64]
	if w.Load()&bit != 0 {
		return false
	}
	return w.Or(bit)&bit == 0
}

func (w *worker) publish(admitted, demand int64) {
	w.pub.decisions.Store(w.decisions)
	w.pub.admitted.Store(admitted)
	w.pub.demand.Store(demand)
}

// sleep waits for d, or less if stop is set meanwhile (checked every 50ms).
func sleep(d time.Duration, stop *atomic.Bool) {
	for d > 0 && !stop.Load() {
		s := min(d, 50*time.Millisecond)
		time.Sleep(s)
		d -= s
	}
}

// runOptions is what runMode needs besides the config.
type runOptions struct {
	be       *backend
	names    []string
	runID    string
	progress io.Writer // nil: no progress line
	label    string    // e.g. "hybrid 1/5"
}

// runMode runs one mode on the configured workload and measures it. It stops early, and marks the
// result partial, when ctx is cancelled.
func runMode(ctx context.Context, c *config, mode string, o runOptions) (report.Result, error) {
	res := report.Result{Mode: mode, TargetRPS: c.rps}
	var before serverStats
	var statsErr error
	if redisModes[mode] {
		before, statsErr = o.be.serverStats(ctx)
	}
	f, err := newFleet(mode, c, o.be, o.names, o.runID)
	if err != nil {
		return res, err
	}
	f.awaitReady(ctx, 5*time.Second)

	workers := make([]*worker, c.concurrency)
	var shared *sharedTally
	if c.keys*c.concurrency > sharedTallyLimit {
		shared = &sharedTally{adm: make([]atomic.Int64, c.keys), dem: make([]atomic.Int64, c.keys)}
	}
	seen := newKeySet(c.keys)
	bin := 100 * time.Millisecond
	if c.duration > 0 {
		bin = max(10*time.Millisecond, (c.duration / 100).Round(time.Millisecond))
	}
	for i := range workers {
		var pk *workload.Picker
		var err error
		if c.pattern == workload.Churn {
			pk, err = workload.NewChurnPicker(c.keys, c.seed, uint64(i), c.concurrency)
		} else {
			pk, err = workload.NewPicker(c.pattern, c.keys, c.zipfS, c.seed, uint64(i))
		}
		if err != nil {
			_ = f.close(context.Background())
			return res, err
		}
		w := &worker{
			node:   f.nodes[i%len(f.nodes)],
			nodes:  f.nodes,
			picker: pk,
			pacer:  workload.NewPacer(c.rps / float64(c.concurrency)),
			cost:   c.cost,
			budget: -1,
			shared: shared,
			seen:   seen,
			hist:   report.NewHistogram(),
			bin:    bin,
			recCap: maxRecords / c.concurrency,
		}
		if c.routed {
			if w.router, err = workload.NewRouter(len(f.nodes), c.affinity, c.seed, uint64(i)); err != nil {
				_ = f.close(context.Background())
				return res, err
			}
		}
		if c.requests > 0 {
			w.budget = c.requests / int64(c.concurrency)
			if int64(i) < c.requests%int64(c.concurrency) {
				w.budget++
			}
		}
		if shared == nil {
			w.adm, w.dem = make([]int64, c.keys), make([]int64, c.keys)
		}
		workers[i] = w
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	done := make(chan struct{})
	start := time.Now()
	decideCtx := context.WithoutCancel(ctx) // in-flight decisions finish after Ctrl-C
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(decideCtx, start, &stop)
		}()
	}
	go func() { wg.Wait(); close(done) }()

	var timeout <-chan time.Time
	if c.duration > 0 {
		t := time.NewTimer(c.duration)
		defer t.Stop()
		timeout = t.C
	}
	var tick <-chan time.Time
	if o.progress != nil {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	var last progressSample
wait:
	for {
		select {
		case <-done:
			break wait
		case <-timeout:
			break wait
		case <-ctx.Done():
			res.Partial = true
			break wait
		case <-tick:
			last = printProgress(o.progress, o.label, c, workers, start, last)
		}
	}
	stop.Store(true)
	<-done
	elapsed := time.Since(start)
	if o.progress != nil {
		fmt.Fprint(o.progress, "\r\033[K")
	}
	closeErr := f.close(context.Background())

	// Tally.
	res.Elapsed = report.Duration(elapsed)
	hist := report.NewHistogram()
	var maxLat time.Duration
	keys := make([]report.KeyTally, c.keys)
	var skipped int64
	res.Timeline.Bin = report.Duration(bin)
	for _, w := range workers {
		res.Decisions += w.decisions
		res.Allowed += w.allowed
		res.Errors += w.errs
		res.Local += w.local
		res.First.Keys += w.firsts
		res.First.Local += w.firstLocal
		res.First.Allowed += w.firstAdm
		hist.Merge(w.hist)
		maxLat = max(maxLat, w.maxLat)
		skipped += w.pacer.Skipped()
		if shared == nil {
			for k := range keys {
				keys[k].Admitted += w.adm[k]
				keys[k].Demand += w.dem[k]
			}
		}
		for b := range w.binDem {
			for b >= len(res.Timeline.Demand) {
				res.Timeline.Admitted = append(res.Timeline.Admitted, 0)
				res.Timeline.Demand = append(res.Timeline.Demand, 0)
			}
			res.Timeline.Admitted[b] += w.binAdm[b]
			res.Timeline.Demand[b] += w.binDem[b]
		}
	}
	if shared != nil {
		for k := range keys {
			keys[k] = report.KeyTally{Admitted: shared.adm[k].Load(), Demand: shared.dem[k].Load()}
		}
	}
	res.LocalShare = ratioOf(res.Local, res.Decisions)
	res.First.LocalShare = ratioOf(res.First.Local, res.First.Keys)
	res.DecisionsPerSec = float64(res.Decisions) / elapsed.Seconds()
	res.AchievedRPS = float64(res.Decisions+res.Errors) / elapsed.Seconds()
	res.Accuracy = report.ComputeAccuracy(keys, c.rate, c.burst, elapsed)
	if exact := replayExact(workers, c); exact != nil {
		res.Accuracy.AddExact(keys, exact)
	}
	res.Latency = report.LatencyOf(hist, maxLat)

	if redisModes[mode] {
		counts, pipes, phist, pmax := mergeHooks(f.hooks)
		var after serverStats
		if statsErr == nil {
			after, statsErr = o.be.serverStats(context.WithoutCancel(ctx))
		}
		server := report.DiffCounts(before.calls(), after.calls())
		if statsErr == nil {
			res.Scripts = report.ScriptStats(server, report.DiffCounts(before.usecs(), after.usecs()))
			if before.cpu != nil && after.cpu != nil {
				cpu := report.CPUDelta(*before.cpu, *after.cpu, res.Decisions)
				res.RedisCPU = &cpu
			}
		}
		countedBy := report.CountedByServer
		switch {
		case statsErr != nil:
			res.Notes = append(res.Notes, fmt.Sprintf("INFO commandstats or cpu failed (%v): Redis commands counted by a go-redis hook instead, which misses what the library sends through WithTimeout clones", oneLine(statsErr.Error())))
			server, countedBy = nil, report.CountedByHook
		case o.be.embedded != nil:
			countedBy = report.CountedByMiniredis
		}
		cmds := report.SplitCommands(server, counts, res.Decisions, countedBy)
		res.Redis = &cmds
		res.First.RedisCmdsPerThousand = report.PerThousand(cmds.ClientIssued, res.First.Keys)
		if res.RedisCPU != nil && res.First.Keys > 0 {
			res.First.RedisCPUMsPerThousand = 1e6 * res.RedisCPU.Seconds / float64(res.First.Keys)
		}
		if mode == "hybrid" {
			src, sy := f.hybridStats()
			sy.Pipelines = pipes
			sy.PipelineLatency = report.LatencyOf(phist, pmax)
			if pipes*2 < sy.Flushes {
				res.Notes = append(res.Notes, fmt.Sprintf("only %d of %d reconcile rounds went through the clients' go-redis hooks: the library sends through WithTimeout clones, which carry no hooks", pipes, sy.Flushes))
			}
			res.Sources, res.Sync = &src, &sy
			if sy.Unrecorded > 0 {
				res.Notes = append(res.Notes, fmt.Sprintf("%d tokens admitted by the failure policy could not be recorded for Redis (no local room)", sy.Unrecorded))
			}
		}
	}
	if skipped > 0 && c.rps > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%s requests skipped: workers fell more than %v behind the pacing (decisions too slow for the target rate)",
			fmtCount(skipped), workload.MaxLag))
	}
	if closeErr != nil {
		res.Notes = append(res.Notes, "closing the fleet: "+oneLine(closeErr.Error()))
	}
	return res, nil
}

// replayExact feeds the recorded requests of all workers, per key in time order, through an exact
// token bucket per key, and returns the tokens each admitted; nil if some requests went unrecorded.
func replayExact(workers []*worker, c *config) []int64 {
	start := make([]int, c.keys+1) // per-key offsets into times
	for _, w := range workers {
		if w.recFull {
			return nil
		}
		for _, r := range w.rec {
			start[r.k+1]++
		}
	}
	for k := 1; k <= c.keys; k++ {
		start[k] += start[k-1]
	}
	times := make([]int64, start[c.keys])
	fill := slices.Clone(start[:c.keys])
	for _, w := range workers {
		for _, r := range w.rec {
			times[fill[r.k]] = r.t
			fill[r.k]++
		}
		w.rec = nil
	}
	exact := make([]int64, c.keys)
	for k := range exact {
		ts := times[start[k]:start[k+1]]
		slices.Sort(ts)
		exact[k] = report.ExactAdmitted(ts, c.rate, c.burst, c.cost)
	}
	return exact
}

// progressSample is the previous progress reading, for rates over the last interval.
type progressSample struct {
	at        time.Duration
	decisions int64
}

func printProgress(w io.Writer, label string, c *config, workers []*worker, start time.Time, last progressSample) progressSample {
	var dec, adm, dem int64
	for _, wk := range workers {
		dec += wk.pub.decisions.Load()
		adm += wk.pub.admitted.Load()
		dem += wk.pub.demand.Load()
	}
	now := time.Since(start)
	rate := 0.0
	if dt := (now - last.at).Seconds(); dt > 0 {
		rate = float64(dec-last.decisions) / dt
	}
	total := "∞"
	if c.duration > 0 {
		total = c.duration.String()
	}
	line := fmt.Sprintf("[%s] %.1fs/%s  %s decisions/s  admitted/demand %.3f", label, now.Seconds(), total, fmtCount(int64(rate)), ratioOf(adm, dem))
	if c.pattern != workload.Zipf && c.pattern != workload.Churn {
		exact := min(float64(dem), float64(c.keys)*report.Allowance(c.rate, c.burst, now))
		if exact > 0 {
			line += fmt.Sprintf("  admitted/exact %.3f", float64(adm)/exact)
		}
	}
	fmt.Fprint(w, "\r\033[K"+line)
	return progressSample{at: now, decisions: dec}
}

func ratioOf(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// fmtCount formats n with thousands separators.
func fmtCount(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
