package report

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAllowance(t *testing.T) {
	t.Parallel()
	tests := []struct {
		rate    float64
		burst   int64
		elapsed time.Duration
		want    float64
	}{
		{1000, 200, 10 * time.Second, 10_200},
		{1000, 200, 0, 200},
		{0.5, 10, 4 * time.Second, 12},
		{5000, 1000, 1500 * time.Millisecond, 8500},
	}
	for i, tt := range tests {
		if got := Allowance(tt.rate, tt.burst, tt.elapsed); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("case %d: Allowance(%v, %d, %v) = %v, want %v", i, tt.rate, tt.burst, tt.elapsed, got, tt.want)
		}
	}
}

func TestComputeAccuracy(t *testing.T) {
	t.Parallel()
	// Limit 100/s, burst 20, 10s: each key's exact allowance is 1,020 tokens.
	const rate, burst, elapsed = 100, 20, 10 * time.Second

	t.Run("overload is compared with the allowance", func(t *testing.T) {
		t.Parallel()
		a := ComputeAccuracy([]KeyTally{
			{Admitted: 1020, Demand: 4000},
			{Admitted: 1122, Demand: 4000}, // 10% over
		}, rate, burst, elapsed)
		assert.Equal(t, 2, a.ActiveKeys)
		assert.Equal(t, int64(2142), a.AdmittedTokens)
		assert.Equal(t, int64(8000), a.DemandTokens)
		assert.InDelta(t, 2040, a.AllowanceTokens, 1e-9)
		assert.InDelta(t, 2040, a.IdealTokens, 1e-9)
		assert.InDelta(t, 2142.0/2040, a.AdmittedPerIdeal, 1e-12)
		assert.InDelta(t, 2142.0/2040, a.AdmittedPerAllowance, 1e-12)
		assert.InDelta(t, 2142.0/8000, a.AdmittedPerDemand, 1e-12)
		assert.InDelta(t, 1.1, a.MaxKeyRatio, 1e-12)
		assert.Equal(t, 1, a.MaxKey)
		assert.InDelta(t, 102, a.OvershootTokens, 1e-9)
		assert.Equal(t, 0, a.HonestKeys)
		assert.Zero(t, a.FalseDenialRate)
	})

	t.Run("honest load is compared with the demand and counts false denials", func(t *testing.T) {
		t.Parallel()
		a := ComputeAccuracy([]KeyTally{
			{Admitted: 900, Demand: 900},
			{Admitted: 891, Demand: 900}, // 9 tokens falsely denied
			{Admitted: 0, Demand: 0},     // never asked for: left out
		}, rate, burst, elapsed)
		assert.Equal(t, 2, a.ActiveKeys)
		assert.InDelta(t, 1800, a.IdealTokens, 1e-9)
		assert.InDelta(t, 1791.0/1800, a.AdmittedPerIdeal, 1e-12)
		assert.InDelta(t, 1791.0/1800, a.AdmittedPerDemand, 1e-12)
		assert.Equal(t, 2, a.HonestKeys)
		assert.Equal(t, int64(1800), a.HonestDemand)
		assert.Equal(t, int64(9), a.FalseDenied)
		assert.InDelta(t, 0.005, a.FalseDenialRate, 1e-12)
		assert.Zero(t, a.OvershootTokens)
		assert.Equal(t, 0, a.MaxKey)
	})

	t.Run("mixed keys take the smaller of demand and allowance each", func(t *testing.T) {
		t.Parallel()
		a := ComputeAccuracy([]KeyTally{
			{Admitted: 1020, Demand: 5000}, // hot: ideal 1,020
			{Admitted: 50, Demand: 50},     // cold: ideal 50
		}, rate, burst, elapsed)
		assert.InDelta(t, 1070, a.IdealTokens, 1e-9)
		assert.InDelta(t, 1, a.AdmittedPerIdeal, 1e-12)
		assert.Equal(t, 1, a.HonestKeys)
		assert.Equal(t, int64(50), a.HonestDemand)
	})

	t.Run("no demand gives zeros, not NaN", func(t *testing.T) {
		t.Parallel()
		a := ComputeAccuracy(make([]KeyTally, 3), rate, burst, elapsed)
		assert.Equal(t, 0, a.ActiveKeys)
		assert.Equal(t, -1, a.MaxKey)
		for _, v := range []float64{a.AdmittedPerIdeal, a.AdmittedPerAllowance, a.AdmittedPerDemand, a.FalseDenialRate} {
			assert.False(t, math.IsNaN(v))
			assert.Zero(t, v)
		}
	})
}

func TestExactAdmitted(t *testing.T) {
	t.Parallel()
	ms := int64(time.Millisecond)
	tests := []struct {
		name  string
		times []int64
		rate  float64
		burst int64
		cost  int64
		want  int64
	}{
		{"the burst goes at once", []int64{0, 0, 0, 0}, 1, 3, 1, 3},
		{"then one token per 1/rate", []int64{0, 0, 0, 0, 999 * ms, 1000 * ms, 1500 * ms, 2000 * ms}, 1, 3, 1, 5},
		{"refill stops at the burst", []int64{0, 0, 10_000 * ms, 10_000 * ms, 10_000 * ms}, 1, 2, 1, 4},
		{"weighted requests take cost tokens", []int64{0, 0, 0, 250 * ms}, 4, 5, 2, 6},
		{"no requests, nothing admitted", nil, 100, 10, 1, 0},
		{"a steady stream below the rate is all admitted", func() []int64 {
			var ts []int64
			for i := range 1000 {
				ts = append(ts, int64(i)*2*ms) // 500/s
			}
			return ts
		}(), 1000, 1, 1, 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tt.want, ExactAdmitted(tt.times, tt.rate, tt.burst, tt.cost))
		})
	}
}

func TestAddExact(t *testing.T) {
	t.Parallel()
	keys := []KeyTally{{Admitted: 110, Demand: 400}, {Admitted: 95, Demand: 100}, {Admitted: 0, Demand: 0}}
	a := ComputeAccuracy(keys, 100, 10, time.Second)
	a.AddExact(keys, []int64{100, 100, 0})
	assert.True(t, a.Oracle)
	assert.Equal(t, int64(200), a.ExactTokens)
	assert.InDelta(t, 205.0/200, a.AdmittedPerExact, 1e-12)
	assert.Equal(t, int64(10), a.OverExact, "key 0 got 10 more than the exact bucket")
	assert.Equal(t, int64(5), a.UnderExact, "key 1 was denied 5 the exact bucket admitted")
	assert.InDelta(t, 0.025, a.UnderExactRate, 1e-12)
}

func TestPerThousand(t *testing.T) {
	t.Parallel()
	assert.InDelta(t, 9.5, PerThousand(95, 10_000), 1e-12)
	assert.InDelta(t, 1000, PerThousand(7, 7), 1e-12)
	assert.Zero(t, PerThousand(5, 0))
}

func TestLatencyPercentiles(t *testing.T) {
	t.Parallel()
	h := NewHistogram()
	// 1µs … 10ms in 1µs steps: p50 = 5ms, p99 = 9.9ms, p99.9 = 9.99ms.
	for v := 1; v <= 10_000; v++ {
		Record(h, time.Duration(v)*time.Microsecond)
	}
	l := LatencyOf(h, 0)
	assert.Equal(t, int64(10_000), l.Count)
	within := func(name string, got Duration, want time.Duration) {
		t.Helper()
		if d := math.Abs(float64(time.Duration(got)-want)) / float64(want); d > 0.001 {
			t.Errorf("%s = %v, want %v within 0.1%%", name, time.Duration(got), want)
		}
	}
	within("p50", l.P50, 5*time.Millisecond)
	within("p99", l.P99, 9900*time.Microsecond)
	within("p99.9", l.P999, 9990*time.Microsecond)
	within("max", l.Max, 10*time.Millisecond)
	within("mean", l.Mean, 5000500*time.Nanosecond)

	exact := LatencyOf(h, 10*time.Millisecond+7)
	assert.Equal(t, Duration(10*time.Millisecond+7), exact.Max, "an exact maximum replaces the histogram's rounded one")
	assert.Equal(t, Latency{}, LatencyOf(NewHistogram(), 0), "an empty histogram gives zeros")
	assert.Equal(t, Latency{}, LatencyOf(nil, 0))
}

func TestRecordClamps(t *testing.T) {
	t.Parallel()
	h := NewHistogram()
	Record(h, 0)
	Record(h, -time.Second)
	Record(h, 1000*time.Hour)
	assert.Equal(t, int64(3), h.TotalCount(), "out-of-range values are clamped, not dropped")
}

func TestSplitCommands(t *testing.T) {
	t.Parallel()

	t.Run("server counts are split into client-issued and in-script", func(t *testing.T) {
		t.Parallel()
		server := map[string]int64{
			"evalsha": 100, "hmget": 100, "hset": 100, "time": 100, // one script call runs three commands
			"hgetall": 5,                      // 2 sent by the client, 3 run in scripts
			"hello":   4, "client|setinfo": 8, // connection set-up
			"subscribe": 1,
			"info":      2, // the load generator's own
		}
		client := map[string]int64{"evalsha": 100, "hgetall": 2, "hello": 4}
		c := SplitCommands(server, client, 20_000, CountedByServer)
		assert.Equal(t, CountedByServer, c.CountedBy)
		assert.Equal(t, int64(100+2+1), c.ClientIssued)
		assert.Equal(t, int64(12), c.Setup)
		assert.Equal(t, int64(300+3), c.InScript)
		assert.InDelta(t, 5.15, c.PerThousand, 1e-12)
		assert.InDelta(t, 15.15, c.InScriptPerThousand, 1e-12)
		for _, n := range c.ByName {
			assert.NotEqual(t, "info", n.Name)
		}
		assert.Equal(t, "evalsha", c.ByName[0].Name, "sorted by count, then name")
	})

	t.Run("without server counts the hook's are used", func(t *testing.T) {
		t.Parallel()
		c := SplitCommands(nil, map[string]int64{"evalsha": 40, "eval": 2, "hello": 3}, 1000, CountedByHook)
		assert.Equal(t, CountedByHook, c.CountedBy)
		assert.Equal(t, int64(42), c.ClientIssued)
		assert.Equal(t, int64(3), c.Setup)
		assert.Zero(t, c.InScript)
		assert.InDelta(t, 42, c.PerThousand, 1e-12)
	})

	t.Run("a command the server refused counts nothing", func(t *testing.T) {
		t.Parallel()
		// Redis before 7.2 rejects CLIENT SETINFO: it never shows up in its stats.
		c := SplitCommands(map[string]int64{"evalsha": 10}, map[string]int64{"evalsha": 10, "client|setinfo": 4}, 10, CountedByServer)
		assert.Equal(t, int64(10), c.ClientIssued)
		assert.Zero(t, c.Setup)
	})
}

func TestCPUDelta(t *testing.T) {
	t.Parallel()
	before := CPUTimes{Sys: 10, User: 20, MainSys: 8, MainUser: 16, HasMain: true, Servers: 1}
	after := CPUTimes{Sys: 10.25, User: 20.5, MainSys: 8.2, MainUser: 16.4, HasMain: true, Servers: 1}
	c := CPUDelta(before, after, 50_000)
	assert.InDelta(t, 0.75, c.Seconds, 1e-9)
	assert.InDelta(t, 15, c.MsPerThousand, 1e-9, "750 ms over 50 thousand decisions")
	assert.InDelta(t, 0.6, c.MainThreadSeconds, 1e-9)
	assert.InDelta(t, 12, c.MainThreadMsPerThousand, 1e-9)
	assert.Equal(t, 1, c.Servers)

	t.Run("no main-thread figure unless both readings have it", func(t *testing.T) {
		t.Parallel()
		after := after
		after.HasMain = false
		assert.Zero(t, CPUDelta(before, after, 50_000).MainThreadSeconds)
	})
	t.Run("a counter that went back counts zero", func(t *testing.T) {
		t.Parallel()
		assert.Zero(t, CPUDelta(after, before, 50_000).Seconds)
	})
	t.Run("no decisions, no ratio", func(t *testing.T) {
		t.Parallel()
		assert.Zero(t, CPUDelta(before, after, 0).MsPerThousand)
	})
	t.Run("servers add up", func(t *testing.T) {
		t.Parallel()
		var sum CPUTimes
		sum.Add(CPUTimes{Sys: 1, User: 2, MainSys: 1, MainUser: 1, HasMain: true})
		sum.Add(CPUTimes{Sys: 3, User: 4})
		assert.Equal(t, CPUTimes{Sys: 4, User: 6, MainSys: 1, MainUser: 1, HasMain: false, Servers: 2}, sum)
	})
}

func TestScriptStats(t *testing.T) {
	t.Parallel()
	got := ScriptStats(
		map[string]int64{"evalsha": 100, "eval": 2, "hset": 300, "fcall": 0},
		map[string]int64{"evalsha": 750, "eval": 1000, "hset": 300})
	assert.Equal(t, []ScriptStat{
		{Name: "eval", Calls: 2, Usec: 1000, UsecPerCall: 500},
		{Name: "evalsha", Calls: 100, Usec: 750, UsecPerCall: 7.5},
	}, got, "scripts only, most time first")
	assert.Nil(t, ScriptStats(nil, nil))
}

func TestDiffCounts(t *testing.T) {
	t.Parallel()
	d := DiffCounts(map[string]int64{"evalsha": 10, "info": 3, "get": 5}, map[string]int64{"evalsha": 25, "info": 4, "get": 5, "hset": 7})
	assert.Equal(t, map[string]int64{"evalsha": 15, "info": 1, "hset": 7}, d)
	assert.Nil(t, DiffCounts(nil, map[string]int64{"a": 1}))
}

func TestTimelineRates(t *testing.T) {
	t.Parallel()
	tl := Timeline{Bin: Duration(100 * time.Millisecond), Admitted: []int64{100, 200, 30, 1}}
	// 320ms: bins 0 to 2 are whole; bin 3 is 20% covered: left out.
	assert.Equal(t, []float64{1000, 2000, 300}, tl.Rates(320*time.Millisecond))
	// 380ms: bin 3 is 80% covered and scaled by it.
	got := tl.Rates(380 * time.Millisecond)
	require.Len(t, got, 4)
	assert.InDelta(t, 1/0.08, got[3], 1e-9)
	assert.Len(t, tl.Rates(250*time.Millisecond), 3, "bin 2 half covered is kept")
	assert.Nil(t, Timeline{}.Rates(time.Second))
}

func TestFormatting(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "-", 85: "85ns", 1200: "1.2µs", 340 * time.Microsecond: "340µs",
		2100 * time.Microsecond: "2.1ms", 25 * time.Millisecond: "25ms", 1200 * time.Millisecond: "1.20s",
	} {
		assert.Equal(t, want, FmtDur(d), "FmtDur(%d)", int64(d))
	}
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4500: "-4,500"} {
		assert.Equal(t, want, fmtInt(n))
	}
	assert.Equal(t, "2", trimFloat(2))
	assert.Equal(t, "2.5", trimFloat(2.5))
	assert.Equal(t, "1.5k", fmtShort(1500))
	assert.Equal(t, "2M", fmtShort(2e6))
	assert.Equal(t, 2.5, niceCeil(2.1))
	assert.Equal(t, 10.0, niceCeil(7))
	assert.Equal(t, 20000.0, niceCeil(17000))
}

func sampleReport() Report {
	tl := Timeline{Bin: Duration(time.Second), Admitted: []int64{1100, 1000}, Demand: []int64{4000, 4000}}
	return Report{
		Scenario: Scenario{Modes: []string{"hybrid", "local"}, Backend: "redis standalone 127.0.0.1:16379", Nodes: 8, Keys: 1,
			Pattern: "uniform", Rate: 1000, Burst: 100, Cost: 1, Load: 4, TargetRPS: 4000, Duration: Duration(2 * time.Second),
			Concurrency: 16, SyncInterval: Duration(20 * time.Millisecond), Drift: 0.1, Policy: "local-fallback", GOMAXPROCS: 2},
		Results: []Result{
			{
				Mode: "hybrid", Elapsed: Duration(2 * time.Second), Decisions: 8000, Allowed: 2121, DecisionsPerSec: 4000,
				TargetRPS: 4000, AchievedRPS: 4000, Local: 7000, LocalShare: 0.875,
				First: FirstDecisions{Keys: 1, Local: 1, Allowed: 1, LocalShare: 1, RedisCPUMsPerThousand: 4000, RedisCmdsPerThousand: 80_000},
				Accuracy: func() Accuracy {
					keys := []KeyTally{{Admitted: 2121, Demand: 8000}}
					a := ComputeAccuracy(keys, 1000, 100, 2*time.Second)
					a.AddExact(keys, []int64{2100})
					return a
				}(),
				Latency:  Latency{Count: 8000, P50: 200, P99: 900, P999: Duration(40 * time.Microsecond), Max: Duration(3 * time.Millisecond)},
				Redis:    &Commands{CountedBy: CountedByServer, ClientIssued: 80, PerThousand: 10, ByName: []NameCount{{Name: "evalsha", Server: 80, Client: 80}}},
				Sources:  &Sources{Local: 7000, Central: 1000},
				RedisCPU: &RedisCPU{Seconds: 0.004, MsPerThousand: 0.5, MainThreadSeconds: 0.003, MainThreadMsPerThousand: 0.375, Servers: 1},
				Scripts:  []ScriptStat{{Name: "evalsha", Calls: 80, Usec: 1000, UsecPerCall: 12.5}},
				Sync:     &Sync{Flushes: 100, FlushedKeys: 100, Pipelines: 100},
				Timeline: tl,
			},
			{
				Mode: "local", Partial: true, Elapsed: Duration(1500 * time.Millisecond), Decisions: 6000, Allowed: 6000,
				DecisionsPerSec: 4000, TargetRPS: 4000, AchievedRPS: 2000,
				Accuracy: ComputeAccuracy([]KeyTally{{Admitted: 6000, Demand: 6000}}, 1000, 100, 1500*time.Millisecond),
				Timeline: tl,
			},
		},
	}
}

func TestWriteTable(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	require.NoError(t, WriteTable(&b, sampleReport()))
	out := b.String()
	for _, want := range []string{
		"8 nodes, 1 keys (uniform), limit 1,000/s burst 100 per key",
		"demand 4× the limit = 4,000 req/s",
		"admitted/exact", "redis cmds/1k", "~: too many requests to replay",
		"hybrid", "local*", "* interrupted",
		"10.00",                             // hybrid's Redis commands per 1,000
		"evalsha 80",                        // by name
		"local 87.5% allowed + 0.0% denied", // hybrid's sources
		"achieved 2,000 req/s of the 4,000 targeted",
		"redis cpu ms/1k", "0.500", // hybrid's Redis CPU per 1,000 decisions
		"redis cpu (INFO cpu, whole server): 4.0 ms, main thread 3.0 ms (0.375 ms/1k)",
		"scripts (INFO commandstats): evalsha 80 calls, 12.5 µs/call",
	} {
		assert.Contains(t, out, want)
	}
	lines := strings.Split(out, "\n")
	var header, hyb string
	for _, l := range lines {
		switch f := strings.Fields(l); {
		case len(f) > 0 && f[0] == "mode":
			header = l
		case len(f) > 0 && f[0] == "hybrid":
			hyb = l
		}
	}
	require.NotEmpty(t, header)
	assert.Contains(t, hyb, "1.010", "hybrid admitted 2,121 where the exact bucket admitted 2,100")
	assert.Contains(t, hyb, " 87.5% ", "local share")
	assert.NotContains(t, header, "first local", "churn columns only for churn")
	assert.Contains(t, hyb, "1.00%", "21 tokens over exact")
}

func TestWriteTableChurnColumns(t *testing.T) {
	t.Parallel()
	r := sampleReport()
	r.Scenario.Pattern = "churn"
	var b bytes.Buffer
	require.NoError(t, WriteTable(&b, r))
	out := b.String()
	assert.Contains(t, out, "new keys")
	assert.Contains(t, out, "first local")
	assert.Regexp(t, `(?m)^\s+hybrid\s.*\s1\s+100\.0%\s+4000\.000\s*$`, out, "new keys, first local, cpu per 1,000 new keys")
	assert.Regexp(t, `(?m)^\s+local\*\s.*\s0\s+-\s+-\s*$`, out, "no first decisions, no Redis")
}

func TestWriteTableShowsAffinity(t *testing.T) {
	t.Parallel()
	r := sampleReport()
	f := 0.9
	r.Scenario.Affinity = &f
	var b bytes.Buffer
	require.NoError(t, WriteTable(&b, r))
	assert.Contains(t, b.String(), "1 keys (uniform), affinity 0.9, limit")
}

func TestWriteTableReportsWriteErrors(t *testing.T) {
	t.Parallel()
	assert.Error(t, WriteTable(failWriter{}, sampleReport()))
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

func TestWriteJSON(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	require.NoError(t, WriteJSON(&b, sampleReport()))
	var back Report
	require.NoError(t, json.Unmarshal(b.Bytes(), &back))
	assert.Equal(t, "hybrid", back.Results[0].Mode)
	assert.Equal(t, Duration(20*time.Millisecond), back.Scenario.SyncInterval)
	assert.Contains(t, b.String(), `"sync_interval": "20ms"`)
	assert.Nil(t, back.Results[1].Redis)
}

func TestWriteCSV(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	require.NoError(t, WriteCSV(&b, sampleReport()))
	rows, err := csv.NewReader(&b).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, 3)
	assert.Equal(t, CSVHeader, rows[0])
	for _, r := range rows[1:] {
		assert.Len(t, r, len(CSVHeader))
	}
	col := func(name string) int {
		for i, h := range CSVHeader {
			if h == name {
				return i
			}
		}
		t.Fatalf("no column %q", name)
		return -1
	}
	assert.Equal(t, "10", rows[1][col("redis_per_1000")])
	assert.Equal(t, "0.5", rows[1][col("redis_cpu_ms_per_1000")])
	assert.Equal(t, "12.5", rows[1][col("script_usec_per_call")])
	assert.Equal(t, "", rows[2][col("redis_cpu_ms_per_1000")], "local has no Redis")
	assert.Equal(t, "0.875", rows[1][col("local_share")])
	assert.Equal(t, "4000", rows[1][col("first_redis_cpu_ms_per_1000_keys")])
	assert.Equal(t, "", rows[2][col("redis_per_1000")], "local has no Redis")
	assert.Equal(t, "true", rows[2][col("partial")])
}

func TestWriteSVG(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	require.NoError(t, WriteSVG(&b, sampleReport()))
	// Well-formed XML with one polyline per mode.
	dec := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	lines := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	assert.Equal(t, 2, lines)
	assert.Contains(t, b.String(), "exact limit")
	assert.Contains(t, b.String(), "local (interrupted)")
}
