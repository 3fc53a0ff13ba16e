package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/workload"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
)

// allModes is the order --mode all runs the modes in.
var allModes = []string{"hybrid", "central", "local", "xrate", "redisrate"}

// redisModes are the modes that need Redis.
var redisModes = map[string]bool{"hybrid": true, "central": true, "redisrate": true}

// The defaults of the scenario a bare `go run ./cmd/loadgen` runs: five modes of 2s each on an
// embedded Redis, a fleet of 8 nodes driving 4 keys at 4× their limit (8,000 requests/s in all,
// about what the embedded miniredis's Lua can serve on two cores, so even the strict central mode
// is overloaded).
const (
	defaultNodes    = 8
	defaultKeys     = 4
	defaultRate     = 500
	defaultBurst    = 250
	defaultLoad     = 4
	defaultDuration = 2 * time.Second
	defaultZipfS    = 1.1
	// embeddedSyncTimeout replaces hybrid's 5ms sync timeout on the embedded miniredis, whose Lua
	// runs a few thousand scripts per second at best while sharing the CPU with the load: with 5ms,
	// checks time out, the breaker opens and the demo shows the failure policy, not the limiter.
	embeddedSyncTimeout = 50 * time.Millisecond
)

// config is the parsed and validated command line.
type config struct {
	scenario       string // the --scenario preset, or ""
	modes          []string
	redisAddrs     []string
	sentinelMaster string

	nodes       int
	keys        int
	pattern     workload.Pattern
	zipfS       float64
	affinity    float64 // share of each key's requests sent to its home node, when routed
	routed      bool    // --affinity given or set by --scenario: requests go to nodes by key, not by worker
	rate        float64 // tokens per second per key
	burst       int64
	cost        int64
	load        float64 // demand as a multiple of the limit; 0 when --rps is given
	rps         float64 // total requests per second; 0 = as fast as possible
	duration    time.Duration
	requests    int64
	concurrency int
	seed        uint64

	syncInterval time.Duration
	drift        float64
	policy       outcome.FailurePolicy
	syncTimeout  time.Duration
	leaseAdvance time.Duration
	maxKeys      int

	jsonPath, csvPath, plotPath string
	progress                    string // auto, always or never
}

// presets are the --scenario workloads, as flag values: the figures of issue 10's table come from
// these. Each sets every flag it cares about, so that presets do not depend on the defaults.
var presets = map[string][][2]string{
	"hot":    honest("16", "2000", "400", "0.8"),
	"medium": honest("200", "100", "100", "0.8"),
	"sparse": honest("2000", "10", "20", "0.5"),
	"sticky": append(honest("2000", "10", "20", "0.5"), [2]string{"affinity", "0.9"}),
	"zipf":   append(honest("2000", "10", "20", "0.5"), [2]string{"pattern", "zipf"}, [2]string{"zipf-s", "1.1"}),
	"overload": {
		{"mode", "hybrid,central"}, {"nodes", "8"}, {"duration", "10s"}, {"pattern", "uniform"},
		{"keys", "200"}, {"rate", "100"}, {"burst", "100"}, {"load", "4"},
	},
	"churn": {
		{"mode", "hybrid,central"}, {"nodes", "8"}, {"duration", "10s"}, {"pattern", "churn"},
		{"keys", "100000"}, {"rate", "10"}, {"burst", "20"}, {"rps", "4000"},
	},
}

// presetNames lists the presets in the order --help gives them.
var presetNames = []string{"hot", "medium", "sparse", "sticky", "zipf", "overload", "churn"}

// honest returns a preset of keys uniform keys at load × their limit rate/s, burst burst.
func honest(keys, rate, burst, load string) [][2]string {
	return [][2]string{
		{"mode", "hybrid,central"}, {"nodes", "8"}, {"duration", "10s"}, {"pattern", "uniform"},
		{"keys", keys}, {"rate", rate}, {"burst", burst}, {"load", load},
	}
}

// usageError is a bad command line: main prints it on one line and exits with status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// errHelp is returned for -h and --help, after the usage was printed.
var errHelp = errors.New("help requested")

const usageHeader = `loadgen drives a simulated fleet of rate-limiter nodes and compares hybridrate with the
limiters it replaces, on the same workload: accuracy against an exact token bucket, the share of
decisions made locally, decision latency, and Redis commands and CPU time per decision.

Usage: loadgen [flags]

With no flags it runs every mode for 2s on an embedded Redis (miniredis) and prints the table.
Point --redis at a real redis-server for figures that mean something.

Scenarios (--scenario NAME): hybrid and central, 8 nodes, 10s per mode, library defaults, and
  hot       16 keys, rate 2000/s, burst 400, load 0.8
  medium    200 keys, rate 100/s, burst 100, load 0.8
  sparse    2000 keys, rate 10/s, burst 20, load 0.5
  sticky    sparse with --affinity 0.9
  zipf      sparse with Zipf (s=1.1) key popularity; the total demand is still 0.5 × the sum of
            the limits, so the top keys run far over their limit and the tail barely asks
  overload  200 keys, rate 100/s, burst 100, load 4
  churn     a stream of new keys (--pattern churn): 4,000 req/s over a 100,000-key space, rate
            10/s, burst 20: about 2,400 new keys/s, each seen once or twice, and 4 hot keys
            taking 10% of the requests
Flags given with --scenario override its values. A verdict line under the table checks hybrid
against central in the same run on the scenario's targets (issue 10); a run without --scenario
is checked on the honest-load, overload or churn targets it resembles, without a Redis CPU one.

  go run ./cmd/loadgen --redis HOST:PORT --scenario sparse

Flags:
`

// parseConfig parses args (without the program name). Usage goes to out for --help; errors are
// returned, not printed.
func parseConfig(args []string, out io.Writer) (*config, error) {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		scenarioName = fs.String("scenario", "", "preset `workload`: "+strings.Join(presetNames, ", ")+" (see below); flags given as well override its values")
		mode         = fs.String("mode", "all", "`modes` to run, comma-separated: hybrid, central, local, xrate, redisrate, or all")
		redisAddrs   = fs.String("redis", "", "Redis `addresses`, comma-separated: one = standalone, several = Cluster seeds, or Sentinels with --sentinel-master; none = an embedded miniredis")
		sentinel     = fs.String("sentinel-master", "", "Sentinel master `name`; --redis then lists the Sentinels")
		nodes        = fs.Int("nodes", defaultNodes, "limiter `nodes` in the simulated fleet, each with its own Redis client")
		keys         = fs.Int("keys", defaultKeys, "distinct `keys` (rate-limited clients)")
		pattern      = fs.String("pattern", "uniform", "key access `pattern`: uniform, zipf, hot (every request to one key) or churn (new keys, each seen once or twice, and 4 hot keys taking 10% of the requests; needs --rps)")
		zipfS        = fs.Float64("zipf-s", defaultZipfS, "Zipf `exponent` (above 1) for --pattern zipf")
		affinity     = fs.Float64("affinity", 0, "`share` (0 to 1) of each key's requests sent to its home node (a hash of the key mod --nodes), the rest spread evenly over the other nodes; unset: each worker sticks to one node and picks keys at random (no affinity)")
		rateF        = fs.Float64("rate", defaultRate, "limit `rate` per key, tokens per second")
		burst        = fs.Int64("burst", defaultBurst, "limit `burst` per key, tokens")
		cost         = fs.Int64("cost", 1, "`tokens` each request takes")
		load         = fs.Float64("load", defaultLoad, "demand as a `multiple` of the keys' limit (4 = 4× overload, 0.9 = honest)")
		rps          = fs.String("rps", "", "total `requests/s` instead of --load, or \"max\" for as fast as possible")
		duration     = fs.Duration("duration", defaultDuration, "run `time` per mode (0 with --requests: no time limit)")
		requests     = fs.Int64("requests", 0, "stop each mode after this many `requests` (0 = use --duration)")
		conc         = fs.Int("concurrency", 0, "worker `goroutines`, spread over the nodes (0 = 2 per node)")
		seed         = fs.Uint64("seed", 1, "random `seed` of the key sequence (the same for every mode)")
		syncInt      = fs.Duration("sync-interval", hybrid.DefaultSyncInterval, "hybrid: `interval` between reconciles")
		drift        = fs.Float64("drift", hybrid.DefaultDriftThreshold, "hybrid: drift `threshold`, 0 to 1 (0 = every decision in Redis)")
		policy       = fs.String("policy", "local-fallback", "hybrid: failure `policy`: local-fallback, fail-open or fail-closed")
		syncTO       = fs.Duration("check-timeout", hybrid.DefaultCheckTimeout, "hybrid: `timeout` of a synchronous Redis check (50ms on the embedded miniredis)")
		maxKeys      = fs.Int("max-keys", hybrid.DefaultMaxKeys, "hybrid: local key `cap` per node")
		leaseAdv     = fs.Duration("lease-advance", hybrid.LeaseAdvance, "hybrid: refill Redis may lend ahead while a key is under its rate (`duration`, 0 to 1m; 0 = none)")
		jsonPath     = fs.String("json", "", "write the full report as JSON to `file`")
		csvPath      = fs.String("csv", "", "write one summary row per mode as CSV to `file`")
		plotPath     = fs.String("plot", "", "write the admitted rate over time per mode as an SVG to `file`")
		progress     = fs.String("progress", "auto", "live progress line on stderr: `auto` (on a terminal), always or never")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(out, usageHeader)
			fs.SetOutput(out)
			fs.PrintDefaults()
			return nil, errHelp
		}
		return nil, usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q (flags only; see --help)", fs.Arg(0))
	}
	set := map[string]bool{} // the flags given on the command line
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *scenarioName != "" {
		p, ok := presets[*scenarioName]
		if !ok {
			return nil, usagef("--scenario %q: want one of %s", *scenarioName, strings.Join(presetNames, ", "))
		}
		for _, kv := range p {
			name, v := kv[0], kv[1]
			// A preset's demand gives way to either demand flag.
			if set[name] || (name == "rps" || name == "load") && (set["rps"] || set["load"]) {
				continue
			}
			if err := fs.Set(name, v); err != nil {
				return nil, fmt.Errorf("scenario %s: %s=%s: %w", *scenarioName, name, v, err) // a bug in presets
			}
		}
	}
	routed := false // --affinity given or set by the scenario
	fs.Visit(func(f *flag.Flag) { routed = routed || f.Name == "affinity" })

	c := &config{
		scenario: *scenarioName, nodes: *nodes, keys: *keys, zipfS: *zipfS, affinity: *affinity, routed: routed,
		rate: *rateF, burst: *burst, cost: *cost,
		duration: *duration, requests: *requests, concurrency: *conc, seed: *seed,
		syncInterval: *syncInt, drift: *drift, syncTimeout: *syncTO, maxKeys: *maxKeys, leaseAdvance: *leaseAdv,
		sentinelMaster: *sentinel, jsonPath: *jsonPath, csvPath: *csvPath, plotPath: *plotPath,
		progress: *progress,
	}
	var err error
	if c.modes, err = parseModes(*mode); err != nil {
		return nil, err
	}
	if *redisAddrs != "" {
		for _, a := range strings.Split(*redisAddrs, ",") {
			a = strings.TrimSpace(a)
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				return nil, usagef("--redis: bad address %q: want HOST:PORT", a)
			}
			c.redisAddrs = append(c.redisAddrs, a)
		}
	}
	if c.sentinelMaster != "" && len(c.redisAddrs) == 0 {
		return nil, usagef("--sentinel-master needs --redis with the Sentinel addresses")
	}
	if c.pattern, err = workload.ParsePattern(*pattern); err != nil {
		return nil, usagef("--pattern: %v", err)
	}
	switch {
	case c.nodes < 1 || c.nodes > 1024:
		return nil, usagef("--nodes %d: want 1 to 1024", c.nodes)
	case c.keys < 1 || c.keys > 100_000_000:
		return nil, usagef("--keys %d: want 1 to 100000000", c.keys)
	case c.pattern == workload.Hot && set["keys"] && c.keys != 1:
		return nil, usagef("--pattern hot drives a single key; drop --keys %d", c.keys)
	case c.routed && !(c.affinity >= 0 && c.affinity <= 1):
		return nil, usagef("--affinity %v: want a share from 0 to 1", c.affinity)
	case c.pattern == workload.Churn && c.keys <= workload.ChurnHotKeys:
		return nil, usagef("--pattern churn: want --keys above %d (the hot keys), e.g. --scenario churn", workload.ChurnHotKeys)
	case c.pattern == workload.Churn && *rps == "":
		return nil, usagef("--pattern churn needs --rps: --load would count every key of its key space as busy")
	case c.pattern == workload.Zipf && !(c.zipfS > 1 && c.zipfS < 100):
		return nil, usagef("--zipf-s %v: want above 1 (and below 100)", c.zipfS)
	case !(c.rate > 0 && c.rate <= 1e9):
		return nil, usagef("--rate %v: want a number in (0, 1e9] tokens per second", c.rate)
	case c.burst < 1 || c.burst > 1e9:
		return nil, usagef("--burst %d: want 1 to 1000000000", c.burst)
	case c.cost < 1 || c.cost > c.burst:
		return nil, usagef("--cost %d: want 1 to --burst (%d)", c.cost, c.burst)
	case c.duration < 0:
		return nil, usagef("--duration %v: want 0 or more", c.duration)
	case c.requests < 0:
		return nil, usagef("--requests %d: want 0 or more", c.requests)
	case c.duration == 0 && c.requests == 0:
		return nil, usagef("--duration 0 needs --requests: a mode must stop somehow")
	case c.concurrency < 0 || c.concurrency > 100_000:
		return nil, usagef("--concurrency %d: want 0 (2 per node) to 100000", c.concurrency)
	case c.concurrency > 0 && c.concurrency < c.nodes:
		return nil, usagef("--concurrency %d: want at least --nodes (%d), so that every node gets traffic", c.concurrency, c.nodes)
	case c.syncInterval < time.Millisecond || c.syncInterval > time.Minute:
		return nil, usagef("--sync-interval %v: want 1ms to 1m", c.syncInterval)
	case !(c.drift >= 0 && c.drift <= 1):
		return nil, usagef("--drift %v: want 0 to 1", c.drift)
	case c.syncTimeout < 100*time.Microsecond || c.syncTimeout > 10*time.Second:
		return nil, usagef("--check-timeout %v: want 100µs to 10s", c.syncTimeout)
	case c.leaseAdvance < 0 || c.leaseAdvance > time.Minute:
		return nil, usagef("--lease-advance %v: want 0 to 1m", c.leaseAdvance)
	case c.maxKeys < 64:
		return nil, usagef("--max-keys %d: want at least 64", c.maxKeys)
	case c.progress != "auto" && c.progress != "always" && c.progress != "never":
		return nil, usagef("--progress %q: want auto, always or never", c.progress)
	case c.plotPath != "" && !strings.HasSuffix(strings.ToLower(c.plotPath), ".svg"):
		return nil, usagef("--plot %q: the plot is an SVG; give a file name ending in .svg", c.plotPath)
	}
	if c.pattern == workload.Hot {
		c.keys = 1
	}
	if c.requests > 0 && !set["duration"] {
		c.duration = 0 // --requests alone: no time limit
	}
	if c.concurrency == 0 {
		c.concurrency = 2 * c.nodes
	}
	if len(c.redisAddrs) == 0 && !set["check-timeout"] {
		c.syncTimeout = embeddedSyncTimeout
	}
	if c.policy, err = parsePolicy(*policy); err != nil {
		return nil, err
	}
	switch {
	case *rps != "" && set["load"]:
		return nil, usagef("--rps and --load both set the demand; give one")
	case *rps == "max":
		c.rps = 0
	case *rps != "":
		v, err := strconv.ParseFloat(*rps, 64)
		if err != nil || !(v > 0 && v <= 1e9) {
			return nil, usagef("--rps %q: want a number of requests per second in (0, 1e9], or max", *rps)
		}
		c.rps = v
	default:
		if !(*load > 0 && *load <= 1e6) || math.IsInf(*load, 0) {
			return nil, usagef("--load %v: want a positive multiple of the limit", *load)
		}
		c.load = *load
		c.rps = c.load * float64(c.keys) * c.rate / float64(c.cost)
		if c.rps > 1e9 {
			return nil, usagef("--load %v: the demand would be %.3g requests/s; lower --load, --keys or --rate", c.load, c.rps)
		}
	}
	return c, nil
}

func parseModes(s string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, m := range strings.Split(s, ",") {
		m = strings.TrimSpace(m)
		if m == "all" {
			for _, a := range allModes {
				if !seen[a] {
					seen[a] = true
					out = append(out, a)
				}
			}
			continue
		}
		known := false
		for _, a := range allModes {
			known = known || a == m
		}
		if !known {
			return nil, usagef("--mode: unknown mode %q (want hybrid, central, local, xrate, redisrate or all)", m)
		}
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	return out, nil
}

func parsePolicy(s string) (outcome.FailurePolicy, error) {
	for _, p := range []outcome.FailurePolicy{outcome.LocalFallback, outcome.FailOpen, outcome.FailClosed} {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, usagef("--policy %q: want local-fallback, fail-open or fail-closed", s)
}

// needsRedis reports whether any of the modes uses Redis.
func (c *config) needsRedis() bool {
	for _, m := range c.modes {
		if redisModes[m] {
			return true
		}
	}
	return false
}
