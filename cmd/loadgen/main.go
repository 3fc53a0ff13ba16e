// Command loadgen measures hybridrate on a simulated fleet, side by side with the limiters it
// replaces: a strict central Redis token bucket, independent in-process buckets, a per-key map of
// golang.org/x/time/rate limiters, and go-redis/redis_rate. For each it reports decisions per
// second, the share made without a Redis round trip, what was admitted against an exact global
// token bucket, false denials, decision latency percentiles, and Redis commands (INFO commandstats)
// and Redis CPU time (INFO cpu) per 1,000 decisions, as Redis itself counts them.
//
// With no flags it runs every mode for 2s against an embedded Redis-compatible server (miniredis)
// and prints the comparison table; point --redis at a real redis-server for figures worth keeping.
// --scenario runs one of issue 10's workloads (hot, medium, sparse, sticky, zipf, overload, churn)
// for hybrid and central, and a verdict line under the table checks hybrid against its targets:
//
//	go run ./cmd/loadgen
//	go run ./cmd/loadgen --redis 127.0.0.1:16379 --nodes 8 --load 4 --duration 10s --plot out.svg
//	go run ./cmd/loadgen --redis 127.0.0.1:16379 --scenario sparse
//
// Exit status: 0 on success, 1 when Redis cannot be reached or an output cannot be written, 2 for a
// bad command line, 130 when interrupted (the partial report is still printed).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/term"

	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/report"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills the process the usual way
	}()
	redis.SetLogger(quietLogger{}) // go-redis would print every failed dial; errors reach us anyway
	tty := term.IsTerminal(int(os.Stderr.Fd()))
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, tty))
}

// quietLogger drops go-redis's internal log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// run is the whole command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, tty bool) int {
	if fleetRequested(args) {
		return runFleet(ctx, args, stdout, stderr)
	}
	c, err := parseConfig(args, stderr)
	if errors.Is(err, errHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 2
	}
	var progress io.Writer
	if c.progress == "always" || c.progress == "auto" && tty {
		progress = stderr
	}

	var be *backend
	if c.needsRedis() {
		if be, err = openBackend(ctx, c); err != nil {
			fmt.Fprintf(stderr, "loadgen: %v\n", err)
			var ue *unreachableError
			if errors.As(err, &ue) {
				fmt.Fprintf(stderr, "loadgen: start a redis-server there, pass the right --redis, or leave --redis out to use an embedded one\n")
			}
			return 1
		}
		defer be.close()
		if be.embedded != nil {
			fmt.Fprintf(stderr, "loadgen: no --redis given: using an embedded Redis-compatible server (miniredis) in this process at %s.\n", be.embedded.Addr())
			fmt.Fprintf(stderr, "loadgen: it shares the CPU with the load and its Lua is much slower than Redis's (hybrid's sync timeout is %v here):\n", c.syncTimeout)
			fmt.Fprintf(stderr, "loadgen: use --redis HOST:PORT for figures worth keeping.\n")
		}
	}

	rep := report.Report{Scenario: scenario(c, be), Started: time.Now()}
	names := keyNames(c.keys)
	runID := newRunID()
	for i, mode := range c.modes {
		if ctx.Err() != nil {
			break
		}
		res, err := runMode(ctx, c, mode, runOptions{
			be: be, names: names, runID: runID, progress: progress,
			label: fmt.Sprintf("%s %d/%d", mode, i+1, len(c.modes)),
		})
		if err != nil {
			fmt.Fprintf(stderr, "loadgen: %s: %v\n", mode, err)
			return 1
		}
		rep.Results = append(rep.Results, res)
		if res.Partial {
			break
		}
	}
	rep.Interrupted = ctx.Err() != nil
	v := report.Judge(rep)
	rep.Verdict = &v

	status := 0
	if err := report.WriteTable(stdout, rep); err != nil {
		fmt.Fprintf(stderr, "loadgen: write report: %v\n", err)
		status = 1
	}
	for _, out := range []struct {
		path  string
		write func(io.Writer, report.Report) error
	}{{c.jsonPath, report.WriteJSON}, {c.csvPath, report.WriteCSV}, {c.plotPath, report.WriteSVG}} {
		if out.path == "" {
			continue
		}
		if err := writeFile(out.path, rep, out.write); err != nil {
			fmt.Fprintf(stderr, "loadgen: %v\n", err)
			status = 1
		}
	}
	if rep.Interrupted {
		fmt.Fprintln(stderr, "loadgen: interrupted; the report covers what ran")
		return 130
	}
	return status
}

func writeFile(path string, rep report.Report, write func(io.Writer, report.Report) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f, rep); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// keyNames returns the names of n keys: "k0", "k1", ….
func keyNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "k" + strconv.Itoa(i)
	}
	return out
}

// newRunID returns a short random id that keeps this run's Redis keys apart from other runs'.
func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func scenario(c *config, be *backend) report.Scenario {
	s := report.Scenario{
		Name: c.scenario, Modes: c.modes, Backend: "none (in-process modes only)",
		Nodes: c.nodes, Keys: c.keys, Pattern: c.pattern.String(), Rate: c.rate, Burst: c.burst, Cost: c.cost,
		Load: c.load, TargetRPS: c.rps, Duration: report.Duration(c.duration), Requests: c.requests,
		Concurrency: c.concurrency, Seed: c.seed, SyncInterval: report.Duration(c.syncInterval), Drift: c.drift,
		Policy: c.policy.String(), SyncTimeout: report.Duration(c.syncTimeout),
		GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU(),
	}
	if c.pattern.String() == "zipf" {
		s.ZipfS = c.zipfS
	}
	if c.routed {
		s.Affinity = &c.affinity
	}
	if be != nil {
		s.Backend, s.RedisVersion = be.desc, be.version
	}
	return s
}
