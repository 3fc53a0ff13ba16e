// Command rlsbench measures envoyproxy/ratelimit and hybridrated side by side on this machine: the
// same redis-server (started here), the same configuration directory in upstream's format, the
// same environment and the same Go gRPC client (callers goroutines sharing one connection, each
// calling ShouldRateLimit in a loop with one descriptor drawn from keys values, all under their
// limits). It also runs a gRPC echo server with the same proto (every call answered OK, no Redis)
// to show what gRPC and the client cost alone. For each server it prints calls/s, latency
// percentiles, and CPU per 1,000 calls of redis-server (INFO cpu) and of the server process
// (/proc/PID/stat), and of the client itself (this process: the load generator's cost), and at the
// end each server's ratios to upstream's figures, run by run. Runs alternate the servers' order
// (ABBA), so that a change of the machine's load weighs on each alike.
//
//	go build -o /tmp/hybridrated ./cmd/hybridrated
//	go install github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36
//	go run ./bench/rlsbench -hybridrated /tmp/hybridrated -upstream ~/go/bin/service_cmd
//
// Servers: "upstream"; "hybridrated" (the defaults: upstream's windows, local-first with window
// leases); "hybridrated-exact" (HYBRIDRATED_WINDOW_LEASE=0: upstream's windows, one INCRBY per
// check); "hybridrated-hybrid" (HYBRIDRATED_ALGORITHM=hybrid: local-first token buckets);
// "hybridrated-before" (the -before binary with the defaults: an older build, for a before and
// after in one run); "echo". docs/sidecar.md has the figures.
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

// config is the limits file, in upstream's format: every key far under its limit.
const config = `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100000000}
`

func main() {
	echo := flag.String("echo-serve", "", "internal: serve the echo RateLimitService on this address")
	upstream := flag.String("upstream", "", "envoyproxy/ratelimit's service_cmd binary (empty: skip)")
	hybridrated := flag.String("hybridrated", "", "hybridrated binary (empty: skip)")
	before := flag.String("before", "", "an older hybridrated binary, run as hybridrated-before (empty: skip)")
	redisServer := flag.String("redis-server", "redis-server", "redis-server binary")
	duration := flag.Duration("duration", 5*time.Second, "measured time per server and run")
	callers := flag.Int("callers", 8, "concurrent callers")
	keys := flag.Int("keys", 1000, "distinct descriptor values")
	runs := flag.Int("runs", 2, "runs of every server, interleaved")
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
	if err := run(*upstream, *hybridrated, *before, *redisServer, *duration, *callers, *keys, *runs, strings.Split(*only, ","), *profile); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "rlsbench:", err)
		os.Exit(1)
	}
}

func run(upstream, hybridrated, before, redisServer string, d time.Duration, callers, keys, runs int, servers []string, profile string) error {
	dir, err := os.MkdirTemp("", "rlsbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfgDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "bench.yaml"), []byte(config), 0o644); err != nil {
		return err
	}
	redisAddr := "127.0.0.1:" + strconv.Itoa(freePort())
	rs := exec.Command(redisServer, "--bind", "127.0.0.1", "--port", strings.Split(redisAddr, ":")[1], "--save", "", "--appendonly", "no")
	if err := rs.Start(); err != nil {
		return fmt.Errorf("redis-server: %w", err)
	}
	defer func() { _ = rs.Process.Kill(); _ = rs.Wait() }()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	for i := 0; rdb.Ping(context.Background()).Err() != nil; i++ {
		if i > 100 {
			return fmt.Errorf("redis-server on %s did not answer", redisAddr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Printf("rlsbench: %d callers, %d keys, %v per run, %d runs, redis-server %s\n", callers, keys, d, runs, redisAddr)
	fmt.Printf("%-19s %4s %9s %8s %8s %8s %14s %15s %15s %7s %7s  %s\n", "server", "run", "calls/s", "p50", "p99", "p99.9",
		"redis ms/1000", "server ms/1000", "client ms/1000", "errors", "denied", "redis commands per 1,000 calls")
	all := map[string][]result{} // by server, one per run
	for r := 1; r <= runs; r++ {
		order := servers
		if r%2 == 0 { // ABBA: a drift of the machine's load over a round weighs on every server alike
			order = slices.Clone(servers)
			slices.Reverse(order)
		}
		fmt.Printf("# run %d: load average %s\n", r, loadAvg())
		for _, s := range order {
			if s == "upstream" && upstream == "" || s == "hybridrated-before" && before == "" ||
				strings.HasPrefix(s, "hybridrated") && s != "hybridrated-before" && hybridrated == "" {
				continue
			}
			grpcAddr := "127.0.0.1:" + strconv.Itoa(freePort())
			debugPort := strconv.Itoa(freePort())
			env := append(os.Environ(),
				"RUNTIME_ROOT="+filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
				"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, "USE_STATSD=false", "LOG_LEVEL=warn",
				"PORT="+strconv.Itoa(freePort()), "GRPC_PORT="+strings.Split(grpcAddr, ":")[1],
				"DEBUG_PORT="+debugPort)
			var cmd *exec.Cmd
			switch s {
			case "upstream":
				cmd = exec.Command(upstream)
			case "hybridrated":
				cmd = exec.Command(hybridrated)
			case "hybridrated-exact":
				cmd = exec.Command(hybridrated)
				env = append(env, "HYBRIDRATED_WINDOW_LEASE=0")
			case "hybridrated-before":
				cmd = exec.Command(before)
			case "hybridrated-hybrid":
				cmd = exec.Command(hybridrated)
				env = append(env, "HYBRIDRATED_ALGORITHM=hybrid")
			case "echo":
				cmd = exec.Command(self, "-echo-serve", grpcAddr)
			default:
				return fmt.Errorf("unknown server %q", s)
			}
			cmd.Env = env
			var log strings.Builder
			cmd.Stdout, cmd.Stderr = &log, &log
			if err := rdb.FlushAll(context.Background()).Err(); err != nil {
				return err
			}
			if err := cmd.Start(); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
			var prof func() error
			if profile != "" && s != "echo" {
				prof = func() error {
					return saveProfiles(profile, fmt.Sprintf("%s-%d", s, r), "127.0.0.1:"+debugPort, d)
				}
			}
			res, err := measure(grpcAddr, cmd.Process.Pid, rdb, d, callers, keys, prof)
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if err != nil {
				return fmt.Errorf("%s: %w\n%s", s, err, log.String())
			}
			fmt.Printf("%-19s %4d %9.0f %8s %8s %8s %14.2f %15.2f %15.2f %7d %7d  %s\n", s, r, res.rate, ms(res.p50), ms(res.p99), ms(res.p999),
				res.redisCPU, res.serverCPU, res.clientCPU, res.errors, res.overLimits, res.commands)
			all[s] = append(all[s], res)
		}
	}
	fmt.Printf("# end: load average %s\n", loadAvg())
	summarize(servers, all)
	return nil
}

// summarize prints, for every server but upstream, its ratios to upstream's figures run by run (the
// two measured in the same round, minutes apart at most), with their median and range.
func summarize(servers []string, all map[string][]result) {
	up := all["upstream"]
	if len(up) == 0 {
		return
	}
	fmt.Println("# ratios to upstream in the same run: median [min, max] (the runs, in order)")
	for _, s := range servers {
		rs := all[s]
		if s == "upstream" || len(rs) != len(up) {
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

// result is one measured run.
type result struct {
	rate                float64 // calls per second
	p50, p99, p999      time.Duration
	redisCPU, serverCPU float64 // ms of CPU per 1,000 calls
	clientCPU           float64 // ms of this process's CPU (the load generator's) per 1,000 calls
	errors, overLimits  int64
	commands            string // Redis commands per 1,000 calls, by command
}

func measure(addr string, pid int, rdb *redis.Client, d time.Duration, callers, keys int, prof func() error) (result, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return result{}, err
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	reqs := make([]*rlsv3.RateLimitRequest, keys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u" + strconv.Itoa(i)}}}}}
	}
	// Ready: one answer with the limit loaded.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := c.ShouldRateLimit(ctx, reqs[0])
		cancel()
		if err == nil && r.OverallCode == rlsv3.RateLimitResponse_OK {
			break
		}
		if time.Now().After(deadline) {
			return result{}, fmt.Errorf("no answer within 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	loop := func(until time.Time, lat *[]time.Duration, errs, over *atomic.Int64) {
		var wg sync.WaitGroup
		out := make([][]time.Duration, callers)
		for g := range callers {
			wg.Add(1)
			if lat != nil { // room for about 50k calls a second: no copying while measuring
				out[g] = make([]time.Duration, 0, int(time.Until(until).Seconds()*50_000)/callers+1)
			}
			go func() {
				defer wg.Done()
				i := g * 7919
				for time.Now().Before(until) {
					i++
					t0 := time.Now()
					r, err := c.ShouldRateLimit(context.Background(), reqs[i%keys])
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
	var errs, over atomic.Int64
	loop(time.Now().Add(time.Second), nil, &errs, &over) // warm-up: connections, leases, scripts
	errs.Store(0)
	over.Store(0)
	if err := rdb.ConfigResetStat(context.Background()).Err(); err != nil {
		return result{}, err
	}
	r0, err := redisCPU(rdb)
	if err != nil {
		return result{}, err
	}
	p0, c0 := procCPU(pid), procCPU(os.Getpid())
	start := time.Now()
	var lat []time.Duration
	profErr := make(chan error, 1)
	if prof != nil {
		go func() { profErr <- prof() }()
	}
	loop(start.Add(d), &lat, &errs, &over)
	el := time.Since(start)
	if prof != nil {
		if err := <-profErr; err != nil {
			return result{}, err
		}
	}
	r1, err := redisCPU(rdb)
	if err != nil {
		return result{}, err
	}
	p1, c1 := procCPU(pid), procCPU(os.Getpid())
	cmds, err := commandStats(rdb)
	if err != nil {
		return result{}, err
	}
	slices.Sort(lat)
	n := float64(len(lat))
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*n))] }
	return result{rate: n / el.Seconds(), p50: q(0.5), p99: q(0.99), p999: q(0.999),
		redisCPU: (r1 - r0) * 1000 / n * 1000, serverCPU: (p1 - p0) * 1000 / n * 1000, clientCPU: (c1 - c0) * 1000 / n * 1000,
		errors: errs.Load(), overLimits: over.Load(), commands: perThousand(cmds, n)}, nil
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
