// Command rlsbench measures envoyproxy/ratelimit and hybridrated side by side on this machine: the
// same redis-server binary and settings, the same configuration directory in upstream's format,
// the same environment and the same Go gRPC client (callers goroutines sharing one connection,
// each calling ShouldRateLimit in a loop with one descriptor drawn from keys values, all under
// their limits). It also runs a gRPC echo server with the same proto (every call answered OK, no
// Redis) to show what gRPC and the client cost alone.
//
// In each run every server is started, with a redis-server of its own, and warmed up for a
// second; then the servers are measured in turn, one -slice each (1s), the order reversed every
// other turn (ABBA), until each has had -duration: a change of the machine's load weighs on every
// server alike. A server waits idle while another is measured. With -sequential, one server at a
// time instead, each under load from its start to its end (the steady state of a server that
// never idles). For each server and run it prints
// calls/s, latency percentiles, CPU per 1,000 calls of its redis-server (INFO cpu), of the server
// process (/proc/PID/stat) and of the client itself (this process: the load generator's cost), and
// the Redis commands per 1,000 calls; at the end, each server's ratios to upstream's figures run by
// run, with their median and range.
//
//	go build -o /tmp/hybridrated ./cmd/hybridrated
//	go install github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36
//	go run ./bench/rlsbench -hybridrated /tmp/hybridrated -upstream ~/go/bin/service_cmd
//
// Servers: "upstream"; "hybridrated" (the defaults: upstream's windows, local-first with window
// leases); "hybridrated-exact" (HYBRIDRATED_WINDOW_LEASE=0: upstream's windows, one INCRBY per
// check); "hybridrated-hybrid" (HYBRIDRATED_ALGORITHM=hybrid: local-first token buckets);
// "hybridrated-before" (the -before binary with the defaults: an older build, for a before and
// after in one run); "echo". A name with "+p1" appended runs that server with GOMAXPROCS=1. With
// -profile, each server's CPU and allocation profiles of the run are saved from its DEBUG_PORT.
// docs/benchmarks.md has the figures.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// config is the limits file, in upstream's format, for a window of unit: every key far under its
// limit.
func config(unit string) string {
	return `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: ` + unit + `, requests_per_unit: 100000000}
`
}

func main() {
	echo := flag.String("echo-serve", "", "internal: serve the echo RateLimitService on this address")
	upstream := flag.String("upstream", "", "envoyproxy/ratelimit's service_cmd binary (empty: skip)")
	hybridrated := flag.String("hybridrated", "", "hybridrated binary (empty: skip)")
	before := flag.String("before", "", "an older hybridrated binary, run as hybridrated-before (empty: skip)")
	redisServer := flag.String("redis-server", "redis-server", "redis-server binary")
	duration := flag.Duration("duration", 5*time.Second, "measured time per server and run")
	sequential := flag.Bool("sequential", false, "measure one server at a time, each under load from its start to its end (each started, warmed up, measured for -duration and stopped; no -profile)")
	slice := flag.Duration("slice", time.Second, "the servers of a run are measured in turn, this long each, until each has had -duration")
	callers := flag.Int("callers", 8, "concurrent callers")
	keys := flag.Int("keys", 1000, "distinct descriptor values")
	runs := flag.Int("runs", 2, "runs of every server, interleaved")
	unit := flag.String("unit", "hour", "the limit's window, as upstream's config names it: second, minute, hour or day")
	profile := flag.String("profile", "", "save CPU and allocation profiles of each hybridrated and upstream run in this directory (from their DEBUG_PORT's /debug/pprof/)")
	clientProfile := flag.String("client-profile", "", "write the load generator's own CPU profile (every run) to this file")
	only := flag.String("servers", "upstream,hybridrated,hybridrated-exact,hybridrated-hybrid,hybridrated-before,echo", "servers to run, in order")
	flag.Parse()
	if *echo != "" {
		if err := serveEcho(*echo); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	redis.SetLogger(quiet{})
	if *clientProfile != "" {
		f, err := os.Create(*clientProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "rlsbench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*upstream, *hybridrated, *before, *redisServer, *duration, *slice, *sequential, *callers, *keys, *runs, strings.Split(*only, ","), *profile, *unit); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "rlsbench:", err)
		os.Exit(1)
	}
}

func run(upstream, hybridrated, before, redisServer string, d, slice time.Duration, sequential bool, callers, keys, runs int, servers []string, profile, unit string) error {
	dir, err := os.MkdirTemp("", "rlsbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfgDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "bench.yaml"), []byte(config(unit)), 0o644); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if slice <= 0 || slice > d {
		slice = d
	}
	nSlices := int((d + slice - 1) / slice)
	if sequential {
		fmt.Printf("rlsbench: %d callers, %d keys, %v per server and run, one server at a time, %d runs\n", callers, keys, d, runs)
	} else {
		fmt.Printf("rlsbench: %d callers, %d keys, %v per server and run in %d slices of %v, %d runs\n", callers, keys, d, nSlices, slice, runs)
	}
	fmt.Printf("%-19s %4s %9s %8s %8s %8s %14s %15s %15s %7s %7s  %s\n", "server", "run", "calls/s", "p50", "p99", "p99.9",
		"redis ms/1000", "server ms/1000", "client ms/1000", "errors", "denied", "redis commands per 1,000 calls")
	all := map[string][]result{} // by server, one per run
	for r := 1; r <= runs; r++ {
		fmt.Printf("# run %d: load average %s\n", r, loadAvg())
		// Every server of the run is up (each with a redis-server of its own) and warmed up; then
		// they are measured in turn, one slice each, the order reversed every other turn (ABBA),
		// so that the machine's changing load weighs on each alike. A server waits idle while
		// another is measured.
		if sequential {
			// One server at a time, under load from its start to its end: each is started, warmed
			// up, measured for -duration in one go and stopped, in ABBA order across runs.
			order := slices.Clone(servers)
			if r%2 == 0 {
				slices.Reverse(order)
			}
			for _, name := range order {
				sv, err := startServer(name, upstream, hybridrated, before, redisServer, self, dir, callers, keys)
				if err == nil && sv != nil {
					err = sv.warmUp()
				}
				if err == nil && sv != nil {
					err = sv.measure(d)
				}
				if sv != nil {
					sv.close()
				}
				if err != nil {
					return err
				}
				if sv == nil {
					continue
				}
				res := sv.result()
				fmt.Printf("%-19s %4d %9.0f %8s %8s %8s %14.2f %15.2f %15.2f %7d %7d  %s\n", sv.name, r, res.rate, ms(res.p50), ms(res.p99), ms(res.p999),
					res.redisCPU, res.serverCPU, res.clientCPU, res.errors, res.overLimits, res.commands)
				all[sv.name] = append(all[sv.name], res)
			}
			continue
		}
		var up []*server
		stop := func() {
			for _, sv := range up {
				sv.close()
			}
		}
		for _, name := range servers {
			sv, err := startServer(name, upstream, hybridrated, before, redisServer, self, dir, callers, keys)
			if sv != nil {
				up = append(up, sv)
			}
			if err != nil {
				stop()
				return err
			}
		}
		for _, sv := range up {
			if err := sv.warmUp(); err != nil {
				stop()
				return err
			}
		}
		profErr := make(chan error, len(up))
		if profile != "" {
			wall := time.Duration(nSlices*len(up)) * slice
			for _, sv := range up {
				if sv.name == "echo" {
					profErr <- nil
					continue
				}
				go func() { profErr <- saveProfiles(profile, fmt.Sprintf("%s-%d", sv.name, r), sv.debugAddr, wall) }()
			}
		}
		for i := range nSlices {
			order := slices.Clone(up)
			if i%2 == 1 {
				slices.Reverse(order)
			}
			for _, sv := range order {
				if err := sv.measure(min(slice, d-time.Duration(i)*slice)); err != nil {
					stop()
					return fmt.Errorf("%s: %w\n%s", sv.name, err, sv.log.String())
				}
			}
		}
		if profile != "" {
			for range up {
				if err := <-profErr; err != nil {
					stop()
					return err
				}
			}
		}
		stop()
		for _, sv := range up {
			res := sv.result()
			fmt.Printf("%-19s %4d %9.0f %8s %8s %8s %14.2f %15.2f %15.2f %7d %7d  %s\n", sv.name, r, res.rate, ms(res.p50), ms(res.p99), ms(res.p999),
				res.redisCPU, res.serverCPU, res.clientCPU, res.errors, res.overLimits, res.commands)
			all[sv.name] = append(all[sv.name], res)
		}
	}
	fmt.Printf("# end: load average %s\n", loadAvg())
	summarize(servers, all)
	return nil
}

// summarize prints, for every server but upstream, its ratios to upstream's figures run by run (the
// two measured in the same round, minutes apart at most), with their median and range.
func summarize(servers []string, all map[string][]result) {
	if len(all["upstream"]) == 0 && len(all["upstream+p1"]) == 0 {
		return
	}
	fmt.Println("# ratios to upstream in the same run (a +p1 server's to upstream+p1's when it ran): median [min, max] (the runs, in order)")
	for _, s := range servers {
		up := all["upstream"]
		if strings.HasSuffix(s, "+p1") && len(all["upstream+p1"]) > 0 {
			up = all["upstream+p1"]
		}
		rs := all[s]
		if strings.HasPrefix(s, "upstream") || len(up) == 0 || len(rs) != len(up) {
			continue
		}
		ratio := func(f func(result) float64, prec int) string {
			v := make([]float64, len(rs))
			for i := range rs {
				v[i] = f(rs[i]) / f(up[i])
			}
			sorted := slices.Clone(v)
			slices.Sort(sorted)
			med := sorted[len(sorted)/2]
			if len(sorted)%2 == 0 {
				med = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
			}
			var b strings.Builder
			fmt.Fprintf(&b, "%.*f [%.*f, %.*f] (", prec, med, prec, sorted[0], prec, sorted[len(sorted)-1])
			for i, x := range v {
				if i > 0 {
					b.WriteByte(' ')
				}
				fmt.Fprintf(&b, "%.*f", prec, x)
			}
			b.WriteByte(')')
			return b.String()
		}
		fmt.Printf("%-19s calls/s %s\n", s, ratio(func(r result) float64 { return r.rate }, 2))
		fmt.Printf("%-19s p99     %s\n", s, ratio(func(r result) float64 { return float64(r.p99) }, 2))
		fmt.Printf("%-19s p50     %s\n", s, ratio(func(r result) float64 { return float64(r.p50) }, 2))
		fmt.Printf("%-19s redis   %s\n", s, ratio(func(r result) float64 { return r.redisCPU }, 4))
		fmt.Printf("%-19s server  %s\n", s, ratio(func(r result) float64 { return r.serverCPU }, 2))
	}
}

// loadAvg is /proc/loadavg's first three fields ("?" where it is missing).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// quiet drops go-redis's log: its dial retries while a redis-server starts are expected.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// server is one server under test, with its own redis-server, and what its slices measured.
type server struct {
	name      string
	cmd, rs   *exec.Cmd
	rdb       *redis.Client
	conn      *grpc.ClientConn
	c         rlsv3.RateLimitServiceClient
	reqs      []*rlsv3.RateLimitRequest
	callers   int
	debugAddr string
	log       strings.Builder

	// Sums over the measured slices.
	lat                          []time.Duration
	elapsed                      time.Duration
	redisCPU, serverCPU, clientC float64 // seconds
	errs, over                   int64
	cmds                         map[string]int64
}

// startServer starts a redis-server and the server name ("upstream", "hybridrated", …; "+p1" appended:
// with GOMAXPROCS=1) on it, and connects the client. It returns the server started so far with an
// error, for close.
func startServer(name, upstream, hybridrated, before, redisServer, self, dir string, callers, keys int) (*server, error) {
	// A name ending in "+p1" is that server run with GOMAXPROCS=1 (a sidecar given one CPU: Go sets
	// GOMAXPROCS from a container's CPU limit).
	s, p1 := strings.CutSuffix(name, "+p1")
	var bin string
	var extra []string
	switch s {
	case "upstream":
		bin = upstream
	case "hybridrated":
		bin = hybridrated
	case "hybridrated-exact":
		bin, extra = hybridrated, []string{"HYBRIDRATED_WINDOW_LEASE=0"}
	case "hybridrated-before":
		bin = before
	case "hybridrated-hybrid":
		bin, extra = hybridrated, []string{"HYBRIDRATED_ALGORITHM=hybrid"}
	case "echo":
		bin = self
	default:
		return nil, fmt.Errorf("unknown server %q", name)
	}
	if bin == "" {
		return nil, nil // its binary was not given: skipped
	}
	sv := &server{name: name, callers: callers, cmds: map[string]int64{}}
	redisAddr := "127.0.0.1:" + strconv.Itoa(freePort())
	sv.rs = exec.Command(redisServer, "--bind", "127.0.0.1", "--port", strings.Split(redisAddr, ":")[1], "--save", "", "--appendonly", "no")
	if err := sv.rs.Start(); err != nil {
		return nil, fmt.Errorf("redis-server: %w", err)
	}
	sv.rdb = redis.NewClient(&redis.Options{Addr: redisAddr})
	for i := 0; sv.rdb.Ping(context.Background()).Err() != nil; i++ {
		if i > 100 {
			return sv, fmt.Errorf("redis-server on %s did not answer", redisAddr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	grpcAddr := "127.0.0.1:" + strconv.Itoa(freePort())
	debugPort := strconv.Itoa(freePort())
	sv.debugAddr = "127.0.0.1:" + debugPort
	env := append(os.Environ(),
		"RUNTIME_ROOT="+filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, "USE_STATSD=false", "LOG_LEVEL=warn",
		"PORT="+strconv.Itoa(freePort()), "GRPC_PORT="+strings.Split(grpcAddr, ":")[1],
		"DEBUG_PORT="+debugPort)
	env = append(env, extra...)
	if p1 {
		env = append(env, "GOMAXPROCS=1")
	}
	if s == "echo" {
		sv.cmd = exec.Command(bin, "-echo-serve", grpcAddr)
	} else {
		sv.cmd = exec.Command(bin)
	}
	sv.cmd.Env = env
	sv.cmd.Stdout, sv.cmd.Stderr = &sv.log, &sv.log
	if err := sv.cmd.Start(); err != nil {
		return sv, fmt.Errorf("%s: %w", name, err)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return sv, err
	}
	sv.conn, sv.c = conn, rlsv3.NewRateLimitServiceClient(conn)
	sv.reqs = make([]*rlsv3.RateLimitRequest, keys)
	for i := range sv.reqs {
		sv.reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u" + strconv.Itoa(i)}}}}}
	}
	return sv, nil
}

func (sv *server) close() {
	if sv.conn != nil {
		_ = sv.conn.Close()
	}
	if sv.cmd != nil && sv.cmd.Process != nil {
		_ = sv.cmd.Process.Kill()
		_ = sv.cmd.Wait()
	}
	_ = sv.rdb.Close()
	_ = sv.rs.Process.Kill()
	_ = sv.rs.Wait()
}

// warmUp waits for an answer with the limit loaded, calls every key once, then calls for a second:
// connections, leases, scripts, and each key's window created before the measured seconds (a
// window's first charge creates its Redis key: once per key and window in production, where a run
// of a few seconds would otherwise count it for the keys a loaded machine's warm-up did not reach).
func (sv *server) warmUp() error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := sv.c.ShouldRateLimit(ctx, sv.reqs[0])
		cancel()
		if err == nil && r.OverallCode == rlsv3.RateLimitResponse_OK {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no answer within 30s: %v\n%s", sv.name, err, sv.log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, req := range sv.reqs {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := sv.c.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: warm-up call: %v", sv.name, err)
		}
	}
	var errs, over atomic.Int64
	sv.loop(time.Now().Add(time.Second), nil, &errs, &over)
	return nil
}

// loop calls from sv.callers goroutines until the time until, appending each call's latency to
// *lat when lat is not nil.
func (sv *server) loop(until time.Time, lat *[]time.Duration, errs, over *atomic.Int64) {
	var wg sync.WaitGroup
	out := make([][]time.Duration, sv.callers)
	keys := len(sv.reqs)
	offset := len(sv.lat) // a slice goes on where the last one stopped, roughly
	for g := range sv.callers {
		wg.Add(1)
		if lat != nil { // room for about 50k calls a second: no copying while measuring
			out[g] = make([]time.Duration, 0, int(time.Until(until).Seconds()*50_000)/sv.callers+1)
		}
		go func() {
			defer wg.Done()
			i := g*7919 + offset
			for time.Now().Before(until) {
				i++
				t0 := time.Now()
				r, err := sv.c.ShouldRateLimit(context.Background(), sv.reqs[i%keys])
				el := time.Since(t0)
				switch {
				case err != nil:
					errs.Add(1)
				case r.OverallCode != rlsv3.RateLimitResponse_OK:
					over.Add(1)
				}
				if lat != nil {
					out[g] = append(out[g], el)
				}
			}
		}()
	}
	wg.Wait()
	if lat != nil {
		for _, o := range out {
			*lat = append(*lat, o...)
		}
	}
}

// measure runs one slice of d and adds what it measured to sv's sums.
func (sv *server) measure(d time.Duration) error {
	ctx := context.Background()
	if err := sv.rdb.ConfigResetStat(ctx).Err(); err != nil {
		return err
	}
	r0, err := redisCPU(sv.rdb)
	if err != nil {
		return err
	}
	p0, c0 := procCPU(sv.cmd.Process.Pid), procCPU(os.Getpid())
	start := time.Now()
	var errs, over atomic.Int64
	sv.loop(start.Add(d), &sv.lat, &errs, &over)
	sv.elapsed += time.Since(start)
	r1, err := redisCPU(sv.rdb)
	if err != nil {
		return err
	}
	p1, c1 := procCPU(sv.cmd.Process.Pid), procCPU(os.Getpid())
	cmds, err := commandStats(sv.rdb)
	if err != nil {
		return err
	}
	for k, v := range cmds {
		sv.cmds[k] += v
	}
	sv.redisCPU += r1 - r0
	sv.serverCPU += p1 - p0
	sv.clientC += c1 - c0
	sv.errs += errs.Load()
	sv.over += over.Load()
	return nil
}

// result is one measured run.
type result struct {
	rate                float64 // calls per second
	p50, p99, p999      time.Duration
	redisCPU, serverCPU float64 // ms of CPU per 1,000 calls
	clientCPU           float64 // ms of this process's CPU (the load generator's) per 1,000 calls
	errors, overLimits  int64
	commands            string // Redis commands per 1,000 calls, by command
}

// result sums sv's slices.
func (sv *server) result() result {
	lat := sv.lat
	slices.Sort(lat)
	n := float64(len(lat))
	if n == 0 {
		return result{}
	}
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*n))] }
	return result{rate: n / sv.elapsed.Seconds(), p50: q(0.5), p99: q(0.99), p999: q(0.999),
		redisCPU: sv.redisCPU * 1000 / n * 1000, serverCPU: sv.serverCPU * 1000 / n * 1000, clientCPU: sv.clientC * 1000 / n * 1000,
		errors: sv.errs, overLimits: sv.over, commands: perThousand(sv.cmds, n)}
}

// commandStats returns redis-server's calls per command since the last CONFIG RESETSTAT (INFO
// commandstats), without the INFO and CONFIG calls of the measurement itself.
func commandStats(rdb *redis.Client) (map[string]int64, error) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		if name == "info" || strings.HasPrefix(name, "config") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("INFO commandstats: %q: %w", line, err)
		}
		out[name] = n
	}
	return out, nil
}

// perThousand formats commands per 1,000 calls, the most frequent first: "incrby=14.2 pexpire=0.1".
func perThousand(cmds map[string]int64, calls float64) string {
	names := make([]string, 0, len(cmds))
	for k := range cmds {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int { return int(cmds[b] - cmds[a]) })
	var b strings.Builder
	for _, k := range names {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%.2f", k, float64(cmds[k])*1000/calls)
	}
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}

// redisCPU returns redis-server's CPU time so far, in seconds (INFO cpu, user + sys).
func redisCPU(rdb *redis.Client) (float64, error) {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
			total += f
		}
	}
	return total, nil
}

// procCPU returns a process's CPU time so far, in seconds (utime + stime of /proc/PID/stat, in
// clock ticks of 1/100 s); 0 where /proc is missing.
func procCPU(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100
}

// saveProfiles saves a CPU profile over most of d, then an allocation profile, from the pprof
// endpoints at addr, as dir/name.cpu.pprof and dir/name.allocs.pprof.
func saveProfiles(dir, name, addr string, d time.Duration) error {
	get := func(path, file string) error {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, file), b, 0o644)
	}
	secs := max(1, int(d.Seconds())-1)
	if err := get("/debug/pprof/profile?seconds="+strconv.Itoa(secs), name+".cpu.pprof"); err != nil {
		return err
	}
	return get("/debug/pprof/allocs", name+".allocs.pprof")
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) + "ms" }

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// echoServer answers every call OK with no work: gRPC's and the client's own cost.
type echoServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

// ShouldRateLimit answers OK.
func (echoServer) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

func serveEcho(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, echoServer{})
	return s.Serve(l)
}
