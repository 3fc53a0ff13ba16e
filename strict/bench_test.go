package strict

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
)

// Benchmarks of the strict scripts against a real redis-server on loopback, on Redis TIME (no clock
// override). docs/algorithms.md records the numbers; run them with
//
//	go test -run '^$' -bench 'BenchmarkStrict' -benchtime 2s -count 5 ./strict/
//
// Every sub-benchmark reports allocations, ops/s and redis-µs/call: the time Redis itself spent per call
// of the command (INFO commandstats usec_per_call), which the load of the client machine does not
// change. "parallel" runs 16 goroutines per GOMAXPROCS against one connection pool, which is how many
// request handlers share one Redis.

const (
	strictBenchKeys        = 10_000 // subjects in the "10k keys" runs
	strictBenchParallelism = 16     // goroutines per GOMAXPROCS in the parallel runs
)

func strictBenchClient(b *testing.B) (*redistest.Server, redis.UniversalClient) {
	b.Helper()
	srv := redistest.Start(b)
	return srv, srv.Client(b, func(o *redis.Options) { o.PoolSize = 64; o.MaxRetries = -1 })
}

// usecPerCall reads Redis's own time per call of cmd (e.g. "evalsha") since the last CONFIG RESETSTAT.
func usecPerCall(b *testing.B, srv *redistest.Server, cmd string) float64 {
	b.Helper()
	info, ok := srv.Do(b, "INFO", "commandstats").(string)
	if !ok {
		b.Fatal("INFO commandstats: not a string")
	}
	for _, line := range strings.Split(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				return f
			}
		}
	}
	return 0
}

func strictBenchSubjects() []string {
	subjects := make([]string, strictBenchKeys)
	for i := range subjects {
		subjects[i] = "user-" + strconv.Itoa(i)
	}
	return subjects
}

// runStrictBench runs do serially and in parallel, on one hot key and spread over 10k keys; cmd is the
// Redis command whose server-side time is reported.
func runStrictBench(b *testing.B, srv *redistest.Server, cmd string, do func(ctx context.Context, subject string) error) {
	subjects := strictBenchSubjects()
	ctx := context.Background()
	report := func(b *testing.B, start time.Time) {
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
		b.ReportMetric(usecPerCall(b, srv, cmd), "redis-µs/call")
	}
	for _, keys := range []int{1, strictBenchKeys} {
		name := "1key"
		if keys > 1 {
			name = "10kkeys"
		}
		b.Run("serial/"+name, func(b *testing.B) {
			srv.ResetStats(b)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if err := do(ctx, subjects[i%keys]); err != nil {
					b.Fatal(err)
				}
			}
			report(b, start)
		})
		b.Run("parallel/"+name, func(b *testing.B) {
			srv.ResetStats(b)
			b.ReportAllocs()
			b.SetParallelism(strictBenchParallelism)
			b.ResetTimer()
			start := time.Now()
			var seq atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919 // each goroutine starts at a different subject
				for pb.Next() {
					i++
					if err := do(ctx, subjects[i%keys]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			report(b, start)
		})
	}
}

// benchStrictAlgo benchmarks AllowN with a limit that is never reached (the admitting path, which
// writes) and, on one exhausted key, the denying path (which only reads).
func benchStrictAlgo(b *testing.B, a Algorithm) {
	srv, rdb := strictBenchClient(b)
	s := newTestStrict(b, rdb, WithTimeout(5*time.Second))
	limit := int64(MaxLimit)
	if a == SlidingLog {
		limit = MaxSlidingLogLimit // the hot key's log holds about one second of requests
	}
	rule := Rule{Name: "bench", Algorithm: a, Limit: limit, Period: time.Second}
	runStrictBench(b, srv, "evalsha", func(ctx context.Context, subject string) error {
		_, err := s.AllowN(ctx, rule, subject, 1)
		return err
	})
	denied := Rule{Name: "denied", Algorithm: a, Limit: 1, Period: time.Hour}
	ctx := context.Background()
	b.Run("serial/denied", func(b *testing.B) {
		_, err := s.Allow(ctx, denied, "d")
		require.NoError(b, err)
		srv.ResetStats(b)
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			r, err := s.Decide(ctx, denied, "d")
			if err != nil || r.Allowed {
				b.Fatal(r, err)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
		b.ReportMetric(usecPerCall(b, srv, "evalsha"), "redis-µs/call")
	})
}

func BenchmarkStrictTokenBucket(b *testing.B)   { benchStrictAlgo(b, TokenBucket) }
func BenchmarkStrictGCRA(b *testing.B)          { benchStrictAlgo(b, GCRA) }
func BenchmarkStrictFixedWindow(b *testing.B)   { benchStrictAlgo(b, FixedWindow) }
func BenchmarkStrictSlidingWindow(b *testing.B) { benchStrictAlgo(b, SlidingWindow) }
func BenchmarkStrictSlidingLog(b *testing.B)    { benchStrictAlgo(b, SlidingLog) }

func BenchmarkStrictShaper(b *testing.B) {
	srv, rdb := strictBenchClient(b)
	s := newTestStrict(b, rdb, WithTimeout(5*time.Second))
	sh, err := s.NewShaper(ShaperRule{Name: "bench", Limit: MaxLimit, Period: time.Second, MaxWait: time.Second})
	require.NoError(b, err)
	runStrictBench(b, srv, "evalsha", func(ctx context.Context, subject string) error {
		_, err := sh.Reserve(ctx, subject)
		return err
	})
}

// BenchmarkStrictMulti checks three rules of three algorithms (per user, per IP, per tenant) in one call.
func BenchmarkStrictMulti(b *testing.B) {
	srv, rdb := strictBenchClient(b)
	s := newTestStrict(b, rdb, WithTimeout(5*time.Second))
	user := Rule{Name: "user", Algorithm: TokenBucket, Limit: MaxLimit, Period: time.Second}
	ip := Rule{Name: "ip", Algorithm: SlidingWindow, Limit: MaxLimit, Period: time.Second}
	tenant := Rule{Name: "tenant", Algorithm: GCRA, Limit: MaxLimit, Period: time.Second}
	runStrictBench(b, srv, "evalsha", func(ctx context.Context, subject string) error {
		_, err := s.AllowMulti(ctx, "acme", []Check{
			{Rule: user, Subject: subject, N: 1},
			{Rule: ip, Subject: "ip-" + subject, N: 1},
			{Rule: tenant, Subject: "acme", N: 1},
		})
		return err
	})
}

// BenchmarkStrictBaseline measures a bare PING and a plain INCR on the same setup: the floor under
// every script call.
func BenchmarkStrictBaseline(b *testing.B) {
	srv, rdb := strictBenchClient(b)
	b.Run("ping", func(b *testing.B) {
		runStrictBench(b, srv, "ping", func(ctx context.Context, _ string) error { return rdb.Ping(ctx).Err() })
	})
	b.Run("incr", func(b *testing.B) {
		runStrictBench(b, srv, "incr", func(ctx context.Context, subject string) error { return rdb.Incr(ctx, subject).Err() })
	})
}

// TestStrictMemoryPerKey measures what one subject costs in Redis for each algorithm, with hashed
// subjects (the production setting: 32 hex digits in every key): MEMORY USAGE of one key (with
// SAMPLES 0, every element counted) and the growth of used_memory per subject over many subjects,
// which includes the keyspace's own overhead. The sliding log is measured with 1 and with 100 requests
// in its window. docs/algorithms.md records the numbers; the bounds below catch a regression.
func TestStrictMemoryPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("measures memory on a real Redis")
	}
	srv := redistest.Start(t)
	ctx := context.Background()
	// usedMemory reads used_memory over the harness's own short-lived connection, so that no go-redis
	// connection (and its query buffer) is open while it is read.
	usedMemory := func() int64 {
		info, ok := srv.Do(t, "INFO", "memory").(string)
		require.True(t, ok)
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				require.NoError(t, err)
				return n
			}
		}
		t.Fatal("no used_memory in INFO memory")
		return 0
	}
	type measure struct {
		name     string
		subjects int
		requests int // per subject
		do       func(s *Limiter, subject string) error
		max      int64 // bound on used_memory growth per subject, bytes
	}
	var ms []measure
	for _, a := range []Algorithm{TokenBucket, GCRA, FixedWindow, SlidingWindow, SlidingLog} {
		rule := Rule{Name: "api", Algorithm: a, Limit: 1000, Period: time.Hour}
		bound := int64(300)
		if a == SlidingLog {
			bound = 600 // two keys
		}
		ms = append(ms, measure{a.String(), 2000, 1, func(s *Limiter, subj string) error {
			_, err := s.Allow(ctx, rule, subj)
			return err
		}, bound})
	}
	log := Rule{Name: "api100", Algorithm: SlidingLog, Limit: 1000, Period: time.Hour}
	ms = append(ms, measure{"sliding_log, 100 requests", 100, 100, func(s *Limiter, subj string) error {
		_, err := s.Allow(ctx, log, subj)
		return err
	}, 12_000})
	ms = append(ms, measure{"shaper", 2000, 1, func(s *Limiter, subj string) error {
		sh, err := s.NewShaper(ShaperRule{Name: "api", Limit: 1000, Period: time.Hour})
		if err == nil {
			_, err = sh.Reserve(ctx, subj)
		}
		return err
	}, 300})

	// Each measure runs on a fresh client, closed before used_memory is read again.
	newStrict := func(rdb redis.UniversalClient) *Limiter {
		return newTestStrict(t, rdb, WithKeyPrefix("hr"), WithHashedSubjects(nil))
	}
	for _, m := range ms {
		rdb := srv.Client(t, func(o *redis.Options) { o.PoolSize = 16 })
		s := newStrict(rdb)
		require.NoError(t, m.do(s, "warm-up"), "loads the script") // the script cache is not per key
		srv.Do(t, "FLUSHALL")
		require.NoError(t, rdb.Close())
		before := usedMemory()
		rdb = srv.Client(t, func(o *redis.Options) { o.PoolSize = 16 })
		s = newStrict(rdb)
		var wg sync.WaitGroup
		var failed atomic.Int64
		for g := 0; g < 16; g++ { // 16 clients at once: only to be quick
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < m.subjects; i += 16 {
					for j := 0; j < m.requests; j++ {
						if err := m.do(s, "user-"+strconv.Itoa(i)); err != nil {
							failed.Add(1)
						}
					}
				}
			}()
		}
		wg.Wait()
		require.Zero(t, failed.Load())
		require.NoError(t, rdb.Close())
		perSubject := (usedMemory() - before) / int64(m.subjects)
		rdb = srv.Client(t)
		keys, err := rdb.Keys(ctx, "*").Result()
		require.NoError(t, err)
		var usage int64
		for _, k := range keys {
			if strings.Contains(k, s.hashed("user-0")) {
				n, err := rdb.MemoryUsage(ctx, k, 0).Result()
				require.NoError(t, err)
				usage += n
			}
		}
		t.Logf("%-26s %d key(s)/subject of %d bytes: MEMORY USAGE %5d B/subject, used_memory growth %5d B/subject",
			m.name, len(keys)/m.subjects, len(keys[0]), usage, perSubject)
		if perSubject > m.max {
			t.Errorf("%s: %d B per subject, want at most %d", m.name, perSubject, m.max)
		}
	}
}

// TestStrictRedisCommandsPerCall pins the Redis work of each script, which machine load cannot blur:
// the commands a call runs inside Redis (INFO commandstats), on the admitting path of an existing key
// and on the denying path. docs/algorithms.md records the table.
func TestStrictRedisCommandsPerCall(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := newTestStrict(t, rdb)
	s.at(0)
	const calls = 50
	type path struct {
		name string
		do   func() (bool, error)
	}
	var paths []path
	for _, a := range []Algorithm{TokenBucket, GCRA, FixedWindow, SlidingWindow, SlidingLog} {
		open := Rule{Name: "open", Algorithm: a, Limit: 1000, Period: time.Hour}
		shut := Rule{Name: "shut", Algorithm: a, Limit: 1, Period: time.Hour}
		paths = append(paths,
			path{a.String() + " admit", func() (bool, error) { r, err := s.Decide(ctx, open, "s"); return r.Allowed, err }},
			path{a.String() + " deny", func() (bool, error) { r, err := s.Decide(ctx, shut, "s"); return !r.Allowed, err }})
	}
	sh, err := s.NewShaper(ShaperRule{Name: "sh", Limit: 1000, Period: time.Hour, MaxWait: time.Hour})
	require.NoError(t, err)
	paths = append(paths, path{"shaper reserve", func() (bool, error) { r, err := sh.Reserve(ctx, "s"); return r.OK(), err }})
	multi := []Check{
		{Rule: Rule{Name: "mu", Algorithm: TokenBucket, Limit: 1000, Period: time.Hour}, Subject: "u", N: 1},
		{Rule: Rule{Name: "mi", Algorithm: SlidingWindow, Limit: 1000, Period: time.Hour}, Subject: "i", N: 1},
		{Rule: Rule{Name: "mt", Algorithm: GCRA, Limit: 1000, Period: time.Hour}, Subject: "t", N: 1},
	}
	paths = append(paths, path{"multi (tb+sw+gcra) admit", func() (bool, error) {
		m, err := s.AllowMulti(ctx, "t", multi)
		return m.Allowed, err
	}})
	// The clock is pinned here, so TIME is not called: production adds one TIME to every line. The log
	// adds a ZREMRANGEBYSCORE to an admission whenever members have left the window.
	want := map[string]string{
		"token_bucket admit":       "hmget=1 hset=1 pexpire=1",
		"token_bucket deny":        "hmget=1",
		"gcra admit":               "get=1 set=1",
		"gcra deny":                "get=1",
		"fixed_window admit":       "hincrby=1 hmget=1",
		"fixed_window deny":        "hmget=1",
		"sliding_window admit":     "hmget=1 hset=1 pexpire=1",
		"sliding_window deny":      "hmget=1",
		"sliding_log admit":        "hget=1 hincrby=1 hset=1 pexpire=2 zadd=1 zrange=1 zrangebyscore=1",
		"sliding_log deny":         "hget=1 zrange=1 zrangebyscore=2",
		"shaper reserve":           "get=1 set=1",
		"multi (tb+sw+gcra) admit": "get=1 hmget=2 hset=2 pexpire=2 set=1",
	}
	for _, p := range paths {
		ok, err := p.do() // the key exists from here on (or is exhausted, for deny)
		require.NoError(t, err)
		if strings.HasSuffix(p.name, "deny") {
			require.False(t, ok, p.name)
		}
		srv.ResetStats(t)
		for i := 0; i < calls; i++ {
			ok, err := p.do()
			require.NoError(t, err)
			require.True(t, ok, p.name)
		}
		stats := srv.CommandStats(t)
		require.Equal(t, int64(calls), stats["evalsha"], p.name)
		var parts []string
		for cmd, n := range stats {
			if cmd == "evalsha" || cmd == "info" || cmd == "config|resetstat" {
				continue
			}
			per := n / calls
			if n%calls != 0 {
				per = -n // not a whole number per call: show the total
			}
			parts = append(parts, cmd+"="+strconv.FormatInt(per, 10))
		}
		sort.Strings(parts)
		got := strings.Join(parts, " ")
		t.Logf("%-26s %s", p.name, got)
		assert.Equal(t, want[p.name], got, p.name)
	}
}

// BenchmarkWindowLeases measures an UpstreamWindow check under WithWindowLeases (10s leases), in
// parallel over 10k keys far from their limit: most checks are served from a lease without Redis.
// It reports Redis calls per 1,000 checks beside the time per check.
func BenchmarkWindowLeases(b *testing.B) {
	_, rdb := strictBenchClient(b)
	l, err := New(rdb, WithKeyPrefix("bench"), WithTimeout(2*time.Second), WithWindowLeases(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	rule := Rule{Name: "uw", Algorithm: UpstreamWindow, Limit: MaxLimit, Period: time.Hour}
	subjects := strictBenchSubjects()
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(strictBenchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s := subjects[int(next.Add(1))%len(subjects)]
			if _, err := l.AllowN(context.Background(), rule, s, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(l.Stats().Calls)*1000/float64(b.N), "redis-calls/1000")
}
