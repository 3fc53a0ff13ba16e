package main

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/report"
)

// backend is the Redis every node of a run talks to: an embedded miniredis, a standalone server, a
// Cluster or a Sentinel-managed master.
type backend struct {
	desc     string
	version  string
	opts     redis.UniversalOptions
	embedded *miniredis.Miniredis
	admin    redis.UniversalClient // the load generator's own client, for PING and INFO

	mu       sync.Mutex
	embedCmd map[string]int64 // commands the embedded server ran, by name (script calls included)
}

// unreachableError is a Redis that did not answer: main prints it and exits with status 1.
type unreachableError struct {
	desc string
	err  error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach Redis (%s): %v", e.desc, e.err)
}

func (e *unreachableError) Unwrap() error { return e.err }

// openBackend connects to the Redis of c, or starts an embedded miniredis when c names none.
func openBackend(ctx context.Context, c *config) (*backend, error) {
	b := &backend{}
	switch {
	case len(c.redisAddrs) == 0:
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("start embedded miniredis: %w", err)
		}
		b.embedded = m
		b.embedCmd = map[string]int64{}
		// miniredis has no INFO commandstats: count what it runs, as Redis does, script calls
		// included (redis.call goes through the same dispatch).
		m.Server().SetPreHook(func(_ *server.Peer, cmd string, args ...string) bool {
			name := strings.ToLower(cmd)
			if containerCommand(name) && len(args) > 0 {
				name += "|" + strings.ToLower(args[0])
			}
			b.mu.Lock()
			b.embedCmd[name]++
			b.mu.Unlock()
			return false
		})
		b.opts.Addrs = []string{m.Addr()}
		b.desc = "embedded miniredis " + m.Addr() + " (in process)"
	case c.sentinelMaster != "":
		b.opts.Addrs, b.opts.MasterName = c.redisAddrs, c.sentinelMaster
		b.desc = fmt.Sprintf("redis sentinel, master %q via %s", c.sentinelMaster, strings.Join(c.redisAddrs, ","))
	case len(c.redisAddrs) > 1:
		b.opts.Addrs = c.redisAddrs
		b.desc = "redis cluster via " + strings.Join(c.redisAddrs, ",")
	default:
		b.opts.Addrs = c.redisAddrs
		b.desc = "redis standalone " + c.redisAddrs[0]
	}
	b.opts.DialTimeout = 2 * time.Second
	admin := b.opts
	admin.PoolSize = 2
	b.admin = redis.NewUniversalClient(&admin)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := b.admin.Ping(pctx).Err(); err != nil {
		b.close()
		return nil, &unreachableError{desc: b.desc, err: err}
	}
	if b.embedded != nil {
		b.version = "miniredis"
	} else if info, err := b.info(pctx, "server"); err == nil {
		b.version = infoField(info, "redis_version")
		if b.version != "" {
			b.desc += " (Redis " + b.version + ")"
		}
	}
	return b, nil
}

// newClient returns a new client for one node, with hook added. ctxDeadlines makes the client honour
// context deadlines (ContextTimeoutEnabled): hybrid then uses it as is, not copies with its own
// timeouts, so the hook sees, and times, every reconcile round. The peers keep go-redis's defaults.
func (b *backend) newClient(hook redis.Hook, ctxDeadlines bool) redis.UniversalClient {
	o := b.opts
	o.ContextTimeoutEnabled = ctxDeadlines
	c := redis.NewUniversalClient(&o)
	c.AddHook(hook)
	return c
}

func (b *backend) close() {
	if b.admin != nil {
		_ = b.admin.Close()
	}
	if b.embedded != nil {
		b.embedded.Close()
	}
}

// info returns INFO section from the server (the first master that answers, in a Cluster).
func (b *backend) info(ctx context.Context, section string) (string, error) {
	if cc, ok := b.admin.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var out string
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			s, err := c.Info(ctx, section).Result()
			mu.Lock()
			if out == "" {
				out = s
			}
			mu.Unlock()
			return err
		})
		return out, err
	}
	return b.admin.Info(ctx, section).Result()
}

// serverStats is what the load generator reads from the server before and after a mode: the calls
// and time per command (INFO commandstats) and the CPU time used so far (INFO cpu), summed over
// the masters of a Cluster.
type serverStats struct {
	cmds map[string]cmdStat
	cpu  *report.CPUTimes // nil when the server keeps none (the embedded miniredis)
}

// calls returns the calls per command.
func (s serverStats) calls() map[string]int64 {
	if s.cmds == nil {
		return nil
	}
	out := make(map[string]int64, len(s.cmds))
	for n, c := range s.cmds {
		out[n] = c.calls
	}
	return out
}

// usecs returns the time per command, µs.
func (s serverStats) usecs() map[string]int64 {
	if s.cmds == nil {
		return nil
	}
	out := make(map[string]int64, len(s.cmds))
	for n, c := range s.cmds {
		out[n] = c.usec
	}
	return out
}

// serverStats reads INFO commandstats and INFO cpu; for the embedded miniredis, which keeps
// neither, the counts of its dispatch hook and no CPU time.
func (b *backend) serverStats(ctx context.Context) (serverStats, error) {
	if b.embedded != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		st := serverStats{cmds: make(map[string]cmdStat, len(b.embedCmd))}
		for n, v := range b.embedCmd {
			st.cmds[n] = cmdStat{calls: v}
		}
		return st, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st := serverStats{cmds: map[string]cmdStat{}, cpu: &report.CPUTimes{}}
	var mu sync.Mutex
	read := func(ctx context.Context, c redis.Cmdable) error {
		s, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		cmds, err := parseCommandStats(s)
		if err != nil {
			return err
		}
		s, err = c.Info(ctx, "cpu").Result()
		if err != nil {
			return err
		}
		cpu, err := parseCPU(s)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for n, v := range cmds {
			t := st.cmds[n]
			t.calls += v.calls
			t.usec += v.usec
			st.cmds[n] = t
		}
		st.cpu.Add(cpu)
		return nil
	}
	if cc, ok := b.admin.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return read(ctx, c) })
		return st, err
	}
	return st, read(ctx, b.admin)
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct {
	calls int64
	usec  int64 // total time in the command, µs (a script's includes the commands it ran)
}

// parseCommandStats parses INFO commandstats lines "cmdstat_evalsha:calls=3,usec=42,..." into calls
// and time per lower-case command name ("evalsha", "script|load").
func parseCommandStats(info string) (map[string]cmdStat, error) {
	out := map[string]cmdStat{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.ToLower(strings.TrimPrefix(name, "cmdstat_"))
		var st cmdStat
		found := false
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			if k != "calls" && k != "usec" {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("INFO commandstats: bad %s in %q", k, line)
			}
			if k == "calls" {
				st.calls, found = n, true
			} else {
				st.usec = n
			}
		}
		if !found {
			return nil, fmt.Errorf("INFO commandstats: no calls in %q", line)
		}
		out[name] = st
	}
	return out, sc.Err()
}

// parseCPU parses INFO cpu: used_cpu_sys and used_cpu_user (seconds, the whole server), and the
// _main_thread variants when the server reports them.
func parseCPU(info string) (report.CPUTimes, error) {
	var t report.CPUTimes
	fields := map[string]*float64{
		"used_cpu_sys": &t.Sys, "used_cpu_user": &t.User,
		"used_cpu_sys_main_thread": &t.MainSys, "used_cpu_user_main_thread": &t.MainUser,
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		p := fields[k]
		if !ok || p == nil {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 {
			return t, fmt.Errorf("INFO cpu: bad %s %q", k, v)
		}
		*p = f
		seen[k] = true
	}
	if !seen["used_cpu_sys"] || !seen["used_cpu_user"] {
		return t, fmt.Errorf("INFO cpu: no used_cpu_sys and used_cpu_user")
	}
	t.HasMain = seen["used_cpu_sys_main_thread"] && seen["used_cpu_user_main_thread"]
	return t, sc.Err()
}

// infoField returns the value of "name:value" in an INFO reply, or "".
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// cmdHook counts the commands one client sends, by INFO commandstats name, and times its
// pipelines (hybrid's reconcile rounds). It sees only what goes through the client it was added to:
// commands sent through a clone made with WithTimeout bypass it. It is safe for concurrent use.
type cmdHook struct {
	mu        sync.Mutex
	counts    map[string]int64
	pipelines int64
	pipeHist  *hdrhistogram.Histogram
	pipeMax   time.Duration
}

func newCmdHook() *cmdHook {
	return &cmdHook{counts: map[string]int64{}, pipeHist: report.NewHistogram()}
}

var _ redis.Hook = (*cmdHook)(nil)

func (h *cmdHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cmdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := statName(cmd)
		h.mu.Lock()
		h.counts[name]++
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *cmdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		d := time.Since(start)
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range cmds {
			h.counts[statName(c)]++
		}
		h.pipelines++
		report.Record(h.pipeHist, d)
		h.pipeMax = max(h.pipeMax, d)
		return err
	}
}

// statName returns the name INFO commandstats uses for cmd: lower case, with the subcommand of a
// container command after a bar ("script|load", "client|setinfo").
func statName(cmd redis.Cmder) string {
	name := strings.ToLower(cmd.Name())
	if containerCommand(name) {
		if args := cmd.Args(); len(args) > 1 {
			if s, ok := args[1].(string); ok {
				return name + "|" + strings.ToLower(s)
			}
		}
	}
	return name
}

// containerCommand reports whether INFO commandstats counts a command by its subcommand.
func containerCommand(name string) bool {
	switch name {
	case "script", "client", "cluster", "command", "config", "function", "object", "memory", "xinfo",
		"acl", "latency", "module", "slowlog", "pubsub":
		return true
	}
	return false
}

// merge adds the counts of hooks into one map, and their pipeline latencies into one histogram.
func mergeHooks(hooks []*cmdHook) (counts map[string]int64, pipelines int64, hist *hdrhistogram.Histogram, maxLat time.Duration) {
	counts = map[string]int64{}
	hist = report.NewHistogram()
	for _, h := range hooks {
		h.mu.Lock()
		for k, v := range h.counts {
			counts[k] += v
		}
		pipelines += h.pipelines
		hist.Merge(h.pipeHist)
		maxLat = max(maxLat, h.pipeMax)
		h.mu.Unlock()
	}
	return counts, pipelines, hist, maxLat
}
