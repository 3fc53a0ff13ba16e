package report

import (
	"sort"
	"strings"
)

// Commands is what a mode cost Redis, in commands.
//
// Redis's INFO commandstats counts every command it runs, including the ones a Lua script calls
// (a token-bucket script shows up as one evalsha plus its hmget, hset, time, …). The main figure,
// ClientIssued, is the commands the clients sent: script calls, plain commands and connection
// set-up. InScript is the rest: work Redis did inside those scripts. Connection set-up (HELLO,
// CLIENT SETINFO, AUTH, SELECT: once per new connection) is counted apart, in Setup, and left out
// of ClientIssued: it does not grow with the decisions.
type Commands struct {
	// CountedBy says where the counts come from: "INFO commandstats" (Redis), "miniredis dispatch"
	// (the embedded server's own count, script calls included, as Redis counts them) or "client
	// hook" (a go-redis hook, when the server could not say).
	CountedBy           string      `json:"counted_by"`
	ClientIssued        int64       `json:"client_issued"`
	Setup               int64       `json:"connection_setup"`
	InScript            int64       `json:"in_script"`
	PerThousand         float64     `json:"per_1000_decisions"`
	InScriptPerThousand float64     `json:"in_script_per_1000_decisions"`
	ByName              []NameCount `json:"by_name"`
}

// NameCount is one command's count.
type NameCount struct {
	Name     string `json:"name"`
	Server   int64  `json:"server"`    // INFO commandstats calls (0 when not available)
	Client   int64  `json:"client"`    // sent by the clients, counted by a go-redis hook
	InScript int64  `json:"in_script"` // the part of Server run inside scripts
}

// The values of Commands.CountedBy.
const (
	CountedByServer    = "INFO commandstats"
	CountedByMiniredis = "miniredis dispatch"
	CountedByHook      = "client hook"
)

// ServerSide reports whether the counts come from the server (which also counts the commands run
// inside scripts), not from the clients.
func (c *Commands) ServerSide() bool { return c.CountedBy != CountedByHook }

// topLevel reports whether a command can only be sent by a client, never called from a script:
// the script calls themselves, script management, connection set-up and Pub/Sub subscriptions.
func topLevel(name string) bool {
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro",
		"hello", "auth", "ping", "select", "readonly", "readwrite", "quit", "reset",
		"subscribe", "unsubscribe", "psubscribe", "punsubscribe", "ssubscribe", "sunsubscribe",
		"multi", "exec", "discard", "watch", "unwatch":
		return true
	}
	for _, p := range []string{"script|", "client|", "cluster|", "command|", "function|"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// setup reports whether a command is connection set-up.
func setup(name string) bool {
	return name == "hello" || name == "auth" || name == "select" || strings.HasPrefix(name, "client|")
}

// ignored reports whether a command is the load generator's own bookkeeping (INFO commandstats).
func ignored(name string) bool { return name == "info" }

// SplitCommands turns the server's per-command call counts over a mode's run (server, nil when the
// server has none) and the clients' own counts (client) into Commands, per 1,000 decisions;
// countedBy names the source of server.
//
// A command a script cannot call counts as client-issued in full. Any other command counts as
// client-issued as far as the clients sent it (min(server, client)), and the rest of the server's
// count ran inside scripts.
func SplitCommands(server, client map[string]int64, decisions int64, countedBy string) Commands {
	c := Commands{CountedBy: countedBy}
	if server == nil {
		c.CountedBy = CountedByHook
	}
	names := map[string]bool{}
	for n := range server {
		names[n] = true
	}
	for n := range client {
		names[n] = true
	}
	for n := range names {
		if ignored(n) {
			continue
		}
		nc := NameCount{Name: n, Server: server[n], Client: client[n]}
		top := nc.Client
		if server != nil {
			top = min(nc.Server, nc.Client)
			if topLevel(n) {
				top = nc.Server
			}
			nc.InScript = nc.Server - top
		}
		if nc.Server == 0 && nc.Client == 0 {
			continue
		}
		if setup(n) {
			c.Setup += top
		} else {
			c.ClientIssued += top
		}
		c.InScript += nc.InScript
		c.ByName = append(c.ByName, nc)
	}
	sort.Slice(c.ByName, func(i, j int) bool {
		a, b := c.ByName[i], c.ByName[j]
		if x, y := max(a.Server, a.Client), max(b.Server, b.Client); x != y {
			return x > y
		}
		return a.Name < b.Name
	})
	c.PerThousand = PerThousand(c.ClientIssued, decisions)
	c.InScriptPerThousand = PerThousand(c.InScript, decisions)
	return c
}

// DiffCounts returns after − before per name, dropping names that did not change. A name missing
// from before counts from zero (Redis lists a command only once it has run).
func DiffCounts(before, after map[string]int64) map[string]int64 {
	if before == nil || after == nil {
		return nil
	}
	d := make(map[string]int64, len(after))
	for n, v := range after {
		if dv := v - before[n]; dv != 0 {
			d[n] = dv
		}
	}
	return d
}

// CPUTimes is the CPU time a Redis server has used since it started, from INFO cpu, in seconds,
// summed over the servers read (the masters of a Cluster). Sys and User cover the whole process:
// its I/O threads and background jobs, and the work of any other client of the same server. The
// main-thread figures (Redis 7+) cover only the thread that runs commands and scripts.
type CPUTimes struct {
	Sys, User         float64
	MainSys, MainUser float64
	HasMain           bool // the server reported the main-thread figures
	Servers           int
}

// Add adds the times of one more server to t.
func (t *CPUTimes) Add(u CPUTimes) {
	t.HasMain = u.HasMain && (t.Servers == 0 || t.HasMain)
	t.Sys += u.Sys
	t.User += u.User
	t.MainSys += u.MainSys
	t.MainUser += u.MainUser
	t.Servers += max(u.Servers, 1)
}

// RedisCPU is the CPU time Redis used during one mode's run: the INFO cpu difference from just before
// the mode's fleet was built to just after it was closed (its final flush included).
type RedisCPU struct {
	Seconds       float64 `json:"seconds"`               // used_cpu_sys + used_cpu_user
	MsPerThousand float64 `json:"ms_per_1000_decisions"` // Seconds in ms per 1,000 decisions
	// The main thread's share, when the server reports it (Redis 7+); 0 otherwise.
	MainThreadSeconds       float64 `json:"main_thread_seconds,omitempty"`
	MainThreadMsPerThousand float64 `json:"main_thread_ms_per_1000_decisions,omitempty"`
	Servers                 int     `json:"servers"`
}

// CPUDelta returns the CPU time Redis used between before and after, per 1,000 decisions. A
// counter that went backwards (a restarted server) counts as zero.
func CPUDelta(before, after CPUTimes, decisions int64) RedisCPU {
	d := func(b, a float64) float64 { return max(a-b, 0) }
	c := RedisCPU{Seconds: d(before.Sys, after.Sys) + d(before.User, after.User), Servers: after.Servers}
	c.MsPerThousand = 1000 * ratio(1000*c.Seconds, float64(decisions))
	if before.HasMain && after.HasMain {
		c.MainThreadSeconds = d(before.MainSys, after.MainSys) + d(before.MainUser, after.MainUser)
		c.MainThreadMsPerThousand = 1000 * ratio(1000*c.MainThreadSeconds, float64(decisions))
	}
	return c
}

// ScriptStat is the time Redis spent in one script command over a mode's run, from INFO
// commandstats; a script's time includes the commands it ran.
type ScriptStat struct {
	Name        string  `json:"name"` // evalsha, eval, fcall, …
	Calls       int64   `json:"calls"`
	Usec        int64   `json:"usec"`
	UsecPerCall float64 `json:"usec_per_call"`
}

// ScriptStats returns the script commands among the per-command call and time differences of a run
// (calls and usec, by INFO commandstats name), busiest first.
func ScriptStats(calls, usec map[string]int64) []ScriptStat {
	var out []ScriptStat
	for _, n := range []string{"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"} {
		if c := calls[n]; c > 0 {
			out = append(out, ScriptStat{Name: n, Calls: c, Usec: usec[n], UsecPerCall: ratio(float64(usec[n]), float64(c))})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Usec > out[j].Usec })
	return out
}
