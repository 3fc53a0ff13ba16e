package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/report"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// short is a small, fast scenario: every mode for 300ms, 2 nodes.
var short = []string{"--duration", "300ms", "--nodes", "2", "--keys", "2", "--rate", "200", "--burst", "100", "--progress", "never"}

func TestRunEmbedded(t *testing.T) {
	dir := t.TempDir()
	jsonPath, csvPath, svgPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.csv"), filepath.Join(dir, "r.svg")
	var stdout, stderr bytes.Buffer
	args := append([]string{"--json", jsonPath, "--csv", csvPath, "--plot", svgPath}, short...)
	code := run(context.Background(), args, &stdout, &stderr, false)
	require.Equal(t, 0, code, "stderr: %s", stderr.String())

	assert.Contains(t, stderr.String(), "embedded Redis-compatible server (miniredis)")
	out := stdout.String()
	for _, m := range allModes {
		assert.Regexp(t, `(?m)^\s+`+m+`\s+[0-9,]+\s`, out, "a row for %s", m)
	}

	b, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var rep report.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Len(t, rep.Results, len(allModes))
	for _, r := range rep.Results {
		assert.Positive(t, r.Decisions, r.Mode)
		assert.Zero(t, r.Errors, r.Mode)
		assert.False(t, r.Partial, r.Mode)
		assert.Equal(t, 2, r.Accuracy.ActiveKeys, r.Mode)
		assert.Equal(t, r.Allowed, r.Accuracy.AdmittedTokens, "%s: cost 1, so tokens = requests", r.Mode)
		assert.True(t, r.Accuracy.Oracle, "%s: every request replayed through an exact bucket", r.Mode)
		assert.Positive(t, r.Latency.P50, r.Mode)
		if redisModes[r.Mode] {
			require.NotNil(t, r.Redis, r.Mode)
			assert.Equal(t, report.CountedByMiniredis, r.Redis.CountedBy, "miniredis has no INFO commandstats")
			assert.Positive(t, r.Redis.ClientIssued, r.Mode)
			assert.Positive(t, r.Redis.InScript, r.Mode)
			assert.Nil(t, r.RedisCPU, "%s: miniredis has no INFO cpu", r.Mode)
		} else {
			assert.Nil(t, r.Redis, r.Mode)
		}
	}
	assert.NotNil(t, rep.Results[0].Sources, "hybrid reports its decision sources")
	require.NotNil(t, rep.Verdict)
	assert.Equal(t, "custom, overload targets", rep.Verdict.Scenario, "4× the limit by default")
	assert.Contains(t, out, report.Judge(rep).String())
	csvData, err := os.ReadFile(csvPath)
	require.NoError(t, err)
	assert.Equal(t, len(allModes)+1, strings.Count(string(csvData), "\n"))
	svg, err := os.ReadFile(svgPath)
	require.NoError(t, err)
	assert.Contains(t, string(svg), "<svg")
}

func TestRunRealRedis(t *testing.T) {
	srv := redistest.Start(t)
	var stdout, stderr bytes.Buffer
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	args := append([]string{"--redis", srv.Addr, "--mode", "hybrid,central,redisrate", "--json", jsonPath}, short...)
	code := run(context.Background(), args, &stdout, &stderr, false)
	require.Equal(t, 0, code, "stderr: %s", stderr.String())
	assert.Regexp(t, `\(Redis [0-9]+\.[0-9]+`, stdout.String(), "the version, from INFO server")
	b, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var rep report.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Len(t, rep.Results, 3)
	for _, r := range rep.Results {
		require.NotNil(t, r.Redis, r.Mode)
		assert.Equal(t, report.CountedByServer, r.Redis.CountedBy, r.Mode)
		assert.Positive(t, r.Redis.InScript, "%s: its script's commands are counted apart", r.Mode)
		require.NotNil(t, r.RedisCPU, "%s: INFO cpu", r.Mode)
		assert.Positive(t, r.RedisCPU.Seconds, r.Mode)
		require.NotEmpty(t, r.Scripts, r.Mode)
		// Sorted by Redis time: on a fresh server a mode that makes few calls (hybrid) may spend
		// more of it in its first EVALs, which compile the script, than in its EVALSHAs.
		i := slices.IndexFunc(r.Scripts, func(sc report.ScriptStat) bool { return sc.Name == "evalsha" })
		require.GreaterOrEqual(t, i, 0, "%s: EVALSHA counted (%+v)", r.Mode, r.Scripts)
		assert.Positive(t, r.Scripts[i].UsecPerCall, r.Mode)
	}
	// A strict central limiter sends one script call per decision, and Redis counts exactly that. On
	// a fresh server each worker's first call may find the script not loaded yet and fall back to
	// one EVAL (Redis 7.0 does not count the refused EVALSHA): at most one more call per worker.
	central := rep.Results[1]
	calls := map[string]int64{}
	for _, n := range central.Redis.ByName {
		calls[n.Name] = n.Server
	}
	workers := int64(rep.Scenario.Concurrency)
	assert.GreaterOrEqual(t, calls["evalsha"]+calls["eval"], central.Decisions)
	assert.LessOrEqual(t, calls["evalsha"]+calls["eval"], central.Decisions+2*workers)
	assert.LessOrEqual(t, calls["eval"], workers)
}

func TestRunBadFlagsExit2(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--nodes", "-3"}, &stdout, &stderr, false)
	assert.Equal(t, 2, code)
	assert.Equal(t, "loadgen: --nodes -3: want 1 to 1024\n", stderr.String())
	assert.Empty(t, stdout.String())
}

func TestRunHelpExit0(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 0, run(context.Background(), []string{"-h"}, &stdout, &stderr, false))
	assert.Contains(t, stderr.String(), "Usage: loadgen")
}

func TestRunUnreachableRedisExit1(t *testing.T) {
	t.Parallel()
	// A port nobody listens on: listen, note it, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--redis", addr, "--mode", "central"}, &stdout, &stderr, false)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "loadgen: cannot reach Redis (redis standalone "+addr+")")
	assert.NotContains(t, stderr.String(), "goroutine", "no stack trace")
	assert.Empty(t, stdout.String())
}

func TestRunInProcessModesNeedNoRedis(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append([]string{"--mode", "local,xrate", "--redis", "127.0.0.1:1"}, short...), &stdout, &stderr, false)
	assert.Equal(t, 0, code, "stderr: %s", stderr.String())
	assert.NotContains(t, stderr.String(), "miniredis")
}

func TestRunInterruptedPrintsPartialReport(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel) // Ctrl-C during the first mode
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"--mode", "local,xrate", "--duration", "20s", "--progress", "never"}, &stdout, &stderr, false)
	assert.Equal(t, 130, code)
	assert.Contains(t, stderr.String(), "interrupted")
	assert.Contains(t, stdout.String(), "local*")
	assert.NotContains(t, stdout.String(), "xrate ", "no mode after the interrupted one")
}

func TestRunRequestCount(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	code := run(context.Background(), []string{"--mode", "xrate", "--requests", "1001", "--rps", "max", "--nodes", "3", "--json", jsonPath, "--progress", "never"}, &stdout, &stderr, false)
	require.Equal(t, 0, code, "stderr: %s", stderr.String())
	b, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var rep report.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	assert.Equal(t, int64(1001), rep.Results[0].Decisions, "exactly the requests asked for, split over the workers")
}

func TestRunAffinityRoutesKeysHome(t *testing.T) {
	t.Parallel()
	// Independent buckets per node over-admit by up to the node count when a key's requests are
	// spread; with every request at its key's home node, each key has one bucket and is exact.
	exactness := func(extra ...string) float64 {
		var stdout, stderr bytes.Buffer
		jsonPath := filepath.Join(t.TempDir(), "r.json")
		args := append([]string{"--mode", "local", "--nodes", "4", "--keys", "8", "--rate", "200", "--burst", "20",
			"--load", "8", "--duration", "400ms", "--progress", "never", "--json", jsonPath}, extra...)
		require.Equal(t, 0, run(context.Background(), args, &stdout, &stderr, false), "stderr: %s", stderr.String())
		b, err := os.ReadFile(jsonPath)
		require.NoError(t, err)
		var rep report.Report
		require.NoError(t, json.Unmarshal(b, &rep))
		return rep.Results[0].Accuracy.AdmittedPerExact
	}
	assert.InDelta(t, 1, exactness("--affinity", "1"), 0.02, "affinity 1: one bucket per key")
	assert.Greater(t, exactness(), 2.5, "no affinity: a bucket per key per node")
}

func TestRunChurnCountsFirstDecisions(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	args := []string{"--mode", "hybrid,local", "--pattern", "churn", "--keys", "100000", "--rps", "2000", "--rate", "10", "--burst", "20",
		"--nodes", "2", "--duration", "400ms", "--progress", "never", "--json", jsonPath}
	require.Equal(t, 0, run(context.Background(), args, &stdout, &stderr, false), "stderr: %s", stderr.String())
	assert.Contains(t, stdout.String(), "first local")
	b, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var rep report.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	for _, r := range rep.Results {
		f := r.First
		// About 1.5 requests per cold key, plus 4 hot keys.
		assert.InDelta(t, float64(r.Decisions)*0.9/1.5, float64(f.Keys), float64(r.Decisions)*0.1, r.Mode)
		assert.Equal(t, int64(r.Accuracy.ActiveKeys), f.Keys, "%s: every key with demand had a first decision", r.Mode)
		assert.Equal(t, f.Keys, f.Allowed, "%s: a new key's first request is within its burst", r.Mode)
		assert.InDelta(t, float64(f.Local)/float64(f.Keys), f.LocalShare, 1e-12, r.Mode)
		assert.InDelta(t, float64(r.Local)/float64(r.Decisions), r.LocalShare, 1e-12, r.Mode)
	}
	assert.Equal(t, rep.Results[1].First.Keys, rep.Results[1].First.Local, "local decides everything locally")
	assert.Positive(t, rep.Results[0].First.RedisCmdsPerThousand, "hybrid's Redis commands per 1,000 new keys")
}

func TestParseCommandStats(t *testing.T) {
	t.Parallel()
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=120,usec=900,usec_per_call=7.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_script|load:calls=2,usec=40,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_HSET:calls=7,usec=7\r\n"
	got, err := parseCommandStats(info)
	require.NoError(t, err)
	assert.Equal(t, map[string]cmdStat{"evalsha": {120, 900}, "script|load": {2, 40}, "hset": {7, 7}}, got)

	_, err = parseCommandStats("cmdstat_get:calls=x,usec=1\r\n")
	assert.Error(t, err)
	_, err = parseCommandStats("cmdstat_get:usec=1\r\n")
	assert.Error(t, err)
}

func TestParseCPU(t *testing.T) {
	t.Parallel()
	// INFO cpu of Redis 7.0.
	info := "# CPU\r\n" +
		"used_cpu_sys:1.250000\r\n" +
		"used_cpu_user:2.500000\r\n" +
		"used_cpu_sys_children:0.000000\r\n" +
		"used_cpu_user_children:0.000000\r\n" +
		"used_cpu_sys_main_thread:1.000000\r\n" +
		"used_cpu_user_main_thread:2.000000\r\n"
	got, err := parseCPU(info)
	require.NoError(t, err)
	assert.Equal(t, report.CPUTimes{Sys: 1.25, User: 2.5, MainSys: 1, MainUser: 2, HasMain: true}, got)

	t.Run("before Redis 7 there is no main-thread figure", func(t *testing.T) {
		t.Parallel()
		got, err := parseCPU("used_cpu_sys:0.5\r\nused_cpu_user:0.25\r\n")
		require.NoError(t, err)
		assert.Equal(t, report.CPUTimes{Sys: 0.5, User: 0.25}, got)
	})
	t.Run("the delta of two readings is per 1,000 decisions", func(t *testing.T) {
		t.Parallel()
		before, err := parseCPU(info)
		require.NoError(t, err)
		after, err := parseCPU("used_cpu_sys:1.750000\nused_cpu_user:3.500000\nused_cpu_sys_main_thread:1.200000\nused_cpu_user_main_thread:2.800000\n")
		require.NoError(t, err)
		// 0.5 + 1.0 = 1.5 s = 1,500 ms over 300,000 decisions: 5 ms per 1,000.
		c := report.CPUDelta(before, after, 300_000)
		assert.InDelta(t, 1.5, c.Seconds, 1e-9)
		assert.InDelta(t, 5, c.MsPerThousand, 1e-9)
		assert.InDelta(t, 1.0, c.MainThreadSeconds, 1e-9)
		assert.InDelta(t, 1000.0/300, c.MainThreadMsPerThousand, 1e-9)
	})
	for _, bad := range []string{"", "used_cpu_sys:1\r\n", "used_cpu_sys:x\r\nused_cpu_user:1\r\n", "used_cpu_sys:-1\r\nused_cpu_user:1\r\n"} {
		_, err := parseCPU(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestStatName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		cmd  redis.Cmder
		want string
	}{
		{redis.NewCmd(ctx, "EVALSHA", "abc", 0), "evalsha"},
		{redis.NewCmd(ctx, "script", "LOAD", "return 1"), "script|load"},
		{redis.NewCmd(ctx, "client", "setinfo", "lib-name", "x"), "client|setinfo"},
		{redis.NewCmd(ctx, "cluster", "slots"), "cluster|slots"},
		{redis.NewCmd(ctx, "hgetall", "k"), "hgetall"},
		{redis.NewCmd(ctx, "script"), "script"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, statName(tt.cmd))
	}
}

func TestRedisRateLimit(t *testing.T) {
	t.Parallel()
	l := redisRateLimit(1000, 200)
	assert.Equal(t, 1000, l.Rate)
	assert.Equal(t, 200, l.Burst)
	assert.Equal(t, "1s", l.Period.String())
	f := redisRateLimit(0.5, 3)
	// The emission interval (period / rate) is what matters: 2s per token.
	assert.InDelta(t, 2.0, f.Period.Seconds()/float64(f.Rate), 1e-9)
}
