package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/fleetsim"
)

// fleetRequested reports whether args ask for the fleet simulator (--fleet).
func fleetRequested(args []string) bool {
	for _, a := range args {
		if a == "--fleet" || a == "-fleet" || strings.HasPrefix(a, "--fleet=") || strings.HasPrefix(a, "-fleet=") {
			return true
		}
	}
	return false
}

const fleetUsage = `loadgen --fleet runs the fleet simulator: N nodes, each a real hybrid.Limiter (its local store,
syncer and scripts), on virtual time against one real redis-server, for N up to thousands, and the
same requests against a central Lua token bucket on the same server. Redis CPU (INFO cpu) and
script calls are measured per 1,000 decisions in the window after the warm-up; accuracy is over the
whole run against the central bucket, which is an exact token bucket on the same clock.

Usage: loadgen --fleet 8,64,512,4096 [flags]

With no --redis it starts redis-server (from PATH) on a free loopback port and stops it at the end.

Scenarios: %s

Flags:
`

// runFleet is loadgen --fleet; it returns the exit status.
func runFleet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadgen --fleet", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		fleetList = fs.String("fleet", "8,64,512,4096", "node `counts`, comma-separated")
		scenarios = fs.String("scenario", "all", "`scenarios`, comma-separated, or all")
		duration  = fs.Duration("duration", 10*time.Second, "virtual `time` per scenario and node count")
		warmup    = fs.Duration("warmup", 2*time.Second, "virtual `time` before the cost, latency and local-share window opens")
		addr      = fs.String("redis", "", "a redis-server `address` (host:port); none = start one from PATH")
		seed      = fs.Uint64("seed", 1, "random `seed` of the request streams")
		jsonPath  = fs.String("json", "", "write the results as JSON to `file`")
		csvPath   = fs.String("csv", "", "write the results as CSV to `file`")
		svgDir    = fs.String("svg", "", "write one SVG chart per figure against N into `dir`")
		relayN    = fs.Int("relay", 0, "put a relay (package relay) in front of every `n` nodes; 0 = none")
		relays    = fs.Int("relays", 0, "put the nodes behind `r` relays at every fleet size (instead of -relay)")
		shard     = fs.Bool("shard", false, "with relays: send each key to one relay, its owner by key (relay.Sharded), instead of each node to its group's")
	)
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			args = []string{"-h"} // also after --fleet, whose value "-h" would otherwise be
			break
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, fleetUsage, strings.Join(fleetsim.ScenarioNames(), ", "))
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 2
	}
	if *relayN < 0 || *relays < 0 || (*relayN > 0 && *relays > 0) {
		fmt.Fprintf(stderr, "loadgen: --relay %d --relays %d: want nodes per relay or a relay count (not both), or 0 for none\n", *relayN, *relays)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "loadgen: unexpected arguments %q\n", fs.Args())
		return 2
	}
	var fleet []int
	for _, f := range strings.Split(*fleetList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 100000 {
			fmt.Fprintf(stderr, "loadgen: --fleet %q: want node counts from 1 to 100000, comma-separated\n", *fleetList)
			return 2
		}
		fleet = append(fleet, n)
	}
	sc, err := fleetsim.Pick(*scenarios)
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 2
	}
	if *warmup < 0 || *duration <= *warmup {
		fmt.Fprintf(stderr, "loadgen: --duration %v must be longer than --warmup %v\n", *duration, *warmup)
		return 2
	}

	var flush func(context.Context) error
	target := *addr
	if target == "" {
		srv, err := startRedisServer(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "loadgen: --fleet needs a real redis-server: %v\n", err)
			fmt.Fprintf(stderr, "loadgen: install it (apt-get install redis-server) or pass --redis HOST:PORT\n")
			return 1
		}
		defer srv.stop()
		target = srv.addr
		fmt.Fprintf(stderr, "loadgen: started redis-server at %s for the simulator\n", target)
	}
	rdb := redis.NewClient(&redis.Options{Addr: target, PoolSize: 64, MaxRetries: -1})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		fmt.Fprintf(stderr, "loadgen: cannot reach Redis at %s: %v\n", target, err)
		return 1
	}
	if *addr == "" {
		flush = func(ctx context.Context) error { return rdb.FlushAll(ctx).Err() }
	}
	probe := func(ctx context.Context) (float64, int64, error) {
		info, err := rdb.Info(ctx, "cpu").Result()
		if err != nil {
			return 0, 0, err
		}
		cpu, err := parseCPU(info)
		if err != nil {
			return 0, 0, err
		}
		info, err = rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			return 0, 0, err
		}
		st, err := parseCommandStats(info)
		if err != nil {
			return 0, 0, err
		}
		return cpu.Sys + cpu.User, st["evalsha"].calls + st["eval"].calls, nil
	}
	// The simulator holds thousands of limiters in one process: a GC pause of that process would
	// hold every simulated node's Redis call at once (and turn checks near the check timeout into
	// failure-policy decisions), which N processes do not share. Collect less often.
	debug.SetGCPercent(400)
	idle, err := fleetsim.MeasureIdle(ctx, probe, time.Second)
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "loadgen: the idle server uses %.2f ms of CPU a second (subtracted from every window)\n", idle*1e3)
	res, err := fleetsim.Run(ctx, fleetsim.Config{
		Client: rdb, Probe: probe, Fleet: fleet, Scenarios: sc, Duration: *duration, Warmup: *warmup,
		Seed: *seed, IdleCPU: idle, Flush: flush, Relay: *relayN, Relays: *relays, Shard: *shard,
		Progress: func(s string) { fmt.Fprintf(stderr, "loadgen: %s\n", s) },
	})
	status := 0
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		status = 1
		if ctx.Err() != nil {
			status = 130
		}
	}
	meta := fleetsim.Meta{Duration: *duration, Warmup: *warmup, Seed: *seed, IdleCPU: idle, Redis: redisVersion(ctx, rdb)}
	if err := fleetsim.WriteTable(stdout, meta, res); err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 1
	}
	outputs := []struct {
		path  string
		write func(io.Writer, fleetsim.Meta, []fleetsim.Result) error
	}{{*jsonPath, fleetsim.WriteJSON}, {*csvPath, fleetsim.WriteCSV}}
	for _, o := range outputs {
		if o.path == "" {
			continue
		}
		if err := writeFleetFile(o.path, func(w io.Writer) error { return o.write(w, meta, res) }); err != nil {
			fmt.Fprintf(stderr, "loadgen: %v\n", err)
			status = 1
		}
	}
	if *svgDir != "" {
		if err := os.MkdirAll(*svgDir, 0o755); err != nil {
			fmt.Fprintf(stderr, "loadgen: %v\n", err)
			return 1
		}
		for _, ch := range fleetsim.Charts {
			path := filepath.Join(*svgDir, "fleet-"+ch.File+".svg")
			if err := writeFleetFile(path, func(w io.Writer) error { return fleetsim.WriteSVG(w, ch, res) }); err != nil {
				fmt.Fprintf(stderr, "loadgen: %v\n", err)
				status = 1
			}
		}
	}
	return status
}

func writeFleetFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

func redisVersion(ctx context.Context, rdb *redis.Client) string {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	return infoField(info, "redis_version")
}

// redisServer is a redis-server the simulator started.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
}

// startRedisServer starts redis-server from PATH on a free loopback port, with no persistence, and
// waits until it answers.
func startRedisServer(ctx context.Context) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--protected-mode", "no", "--maxmemory-policy", "noeviction")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd}
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := rdb.Ping(ctx).Err(); err == nil {
			return s, nil
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("redis-server on port %d did not answer: %w", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *redisServer) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}
