package observe_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/observe"
	"github.com/hybridrate/hybridrate/policy"
)

// TestTrendPerRuleInAlignedSteps: denials per rule per step, the steps aligned on Unix time, shadow
// would-be denials apart (issue 23, item 8: a trend, not a span total).
func TestTrendPerRuleInAlignedSteps(t *testing.T) {
	now := time.Unix(1_000_005, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f := newFixture(t, []observe.Option{observe.WithClock(clock)})
	for i := 0; i < 7; i++ { // per-key: burst 5, then 2 denied
		f.check(t, "a", "", "")
	}
	mu.Lock()
	now = now.Add(10 * time.Second)
	mu.Unlock()
	for i := 0; i < 3; i++ { // 3 more denied
		f.check(t, "a", "", "")
	}
	for i := 0; i < 3; i++ { // trial (shadow): burst 2, then 1 would-be denial
		f.check(t, "c", "GET /v1/search", "")
	}

	tr := f.obs.Trend(10*time.Second, 3)
	assert.EqualValues(t, 999_990, tr.Start, "aligned on a multiple of the step")
	assert.EqualValues(t, 10, tr.Step)
	assert.Equal(t, []int64{0, 7, 6}, tr.Checks)
	assert.Equal(t, []int64{0, 2, 3}, tr.Denied)
	require.Len(t, tr.Rules, 2)
	assert.Equal(t, observe.RuleTrend{Rule: "per-key", N: 5, Series: []int64{0, 2, 3}}, tr.Rules[0])
	assert.Equal(t, observe.RuleTrend{Rule: "trial", Shadow: true, N: 1, Series: []int64{0, 0, 1}}, tr.Rules[1])

	s := f.obs.Snapshot(time.Minute)
	assert.EqualValues(t, 2, s.Trend.Step, "a minute in steps of 2s")
	assert.Len(t, s.Trend.Checks, 30)
	require.NotEmpty(t, s.Trend.Rules)
	assert.EqualValues(t, 5, s.Trend.Rules[0].N)
	assert.Equal(t, time.Second, observe.TrendStep(10*time.Second))
	assert.Equal(t, 30*time.Second, observe.TrendStep(15*time.Minute))
}

// TestRevealSubjectsIsBoundedAndOptional: with RevealSubjects the newest denied subjects are shown
// readably (long values cut), the oldest forgotten past the bound; without it, none.
func TestRevealSubjectsIsBoundedAndOptional(t *testing.T) {
	f := newFixture(t, []observe.Option{observe.WithRevealSubjects(2)})
	long := strings.Repeat("x", 300)
	for _, key := range []string{"k1", "k2", long} {
		for i := 0; i < 6; i++ { // burst 5: one denial each
			f.check(t, key, "", "")
		}
	}
	s := f.obs.Snapshot(time.Minute)
	require.Len(t, s.TopKeys, 3)
	subjects := map[string]bool{}
	for _, k := range s.TopKeys {
		got, ok := f.obs.Subject(k.Key)
		assert.Equal(t, k.Subject, got)
		if ok {
			subjects[got] = true
		}
	}
	assert.Equal(t, map[string]bool{"api_key=k2": true, "api_key=" + long[:64] + "…": true}, subjects,
		"the newest two, values cut at 64 bytes; k1 forgotten")

	plain := newFixture(t, nil)
	for i := 0; i < 6; i++ {
		plain.check(t, "k1", "", "")
	}
	s = plain.obs.Snapshot(time.Minute)
	require.Len(t, s.TopKeys, 1)
	assert.Empty(t, s.TopKeys[0].Subject)
	_, ok := plain.obs.Subject(s.TopKeys[0].Key)
	assert.False(t, ok)

	_, err := observe.New(f.enf, observe.WithRevealSubjects(-1))
	assert.Error(t, err)
}

// TestFleetReportsOnRealRedis: two instances publish to one redis-server; either one's view lists
// both, adds their trends and their subjects (one id per subject under a shared HashKey), shows a
// readable subject only where it was seen, and reads nothing but what is live; Redis holds one
// small report per instance, with a TTL and no raw key, in the limiter's namespace.
func TestFleetReportsOnRealRedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	shared := []byte("fleet-wide")
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	a := newFixture(t, []observe.Option{observe.WithInstance("pod-a"), observe.WithHashKey(shared), observe.WithRevealSubjects(10), observe.WithClock(clock)})
	b := newFixture(t, []observe.Option{observe.WithInstance("pod-b"), observe.WithHashKey(shared)})
	fa, err := observe.NewFleet(a.obs, rdb, observe.WithReportInterval(time.Second))
	require.NoError(t, err)
	fb, err := observe.NewFleet(b.obs, rdb, observe.WithReportInterval(time.Second), observe.WithReportID("pod-b-1"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(fa.ID(), "pod-a-"), fa.ID())
	for i := 0; i < 8; i++ { // 3 denials of alice on pod-a
		a.check(t, "alice", "", "")
	}
	for i := 0; i < 7; i++ { // 2 of alice and 2 of bob on pod-b (each fixture has its own Redis)
		b.check(t, "alice", "", "")
		b.check(t, "bob", "", "")
	}
	// pod-a's clock catches up with pod-b's (real time): the view sums the reports over the
	// viewer's steps, and under -race on a loaded machine the checks above took longer than a
	// step, so pod-b's denials fell after pod-a's last step and were left out of the sum.
	mu.Lock()
	now = time.Now()
	mu.Unlock()
	require.NoError(t, fa.Publish(ctx))
	require.NoError(t, fb.Publish(ctx))
	// A listed report whose key is gone (expired between the two reads) is skipped.
	require.NoError(t, rdb.ZAdd(ctx, "hr:v3:x:{dashboard}", redis.Z{Score: float64(time.Now().UnixMilli()), Member: "ghost"}).Err())

	v, err := fa.View(ctx)
	require.NoError(t, err)
	require.Len(t, v.Instances, 2)
	assert.Equal(t, fa.ID(), v.Self)
	assert.Equal(t, "pod-a", v.Instances[0].Instance)
	assert.True(t, v.Instances[0].Self)
	assert.Equal(t, "pod-b", v.Instances[1].Instance)
	assert.EqualValues(t, 4, v.Instances[1].Totals.Denied)
	require.NotEmpty(t, v.Sum.Rules)
	assert.Equal(t, "per-key", v.Sum.Rules[0].Rule)
	assert.EqualValues(t, 7, v.Sum.Rules[0].N, "3 on pod-a and 4 on pod-b")
	var denied int64
	for _, n := range v.Sum.Denied {
		denied += n
	}
	assert.EqualValues(t, 7, denied)
	require.Len(t, v.Subjects, 2)
	assert.EqualValues(t, 5, v.Subjects[0].N, "alice: one id on both instances")
	assert.Equal(t, []string{"pod-a", "pod-b"}, v.Subjects[0].Instances)
	assert.Equal(t, "api_key=alice", v.Subjects[0].Subject, "pod-a saw alice")
	assert.EqualValues(t, 2, v.Subjects[1].N)
	assert.Empty(t, v.Subjects[1].Subject, "pod-a never saw bob")

	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"hr:v3:x:{dashboard}", "hr:v3:x:{dashboard}:" + fa.ID(), "hr:v3:x:{dashboard}:pod-b-1"}, keys)
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		assert.True(t, ttl > 0 && ttl <= 10*time.Second, "%s: TTL %v", k, ttl)
		if k != "hr:v3:x:{dashboard}" {
			body, err := rdb.Get(ctx, k).Result()
			require.NoError(t, err)
			assert.Less(t, len(body), 4096)
			t.Logf("%s: %d bytes", k, len(body))
			assert.NotContains(t, body, "alice")
			assert.NotContains(t, body, "bob")
		}
	}

	// Run publishes until its context ends, then removes the report.
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); fb.Run(rctx) }()
	cancel()
	<-done
	n, err := rdb.Exists(ctx, "hr:v3:x:{dashboard}:pod-b-1").Result()
	require.NoError(t, err)
	assert.Zero(t, n)
	v, err = fa.View(ctx)
	require.NoError(t, err)
	assert.Len(t, v.Instances, 2, "a view is cached for a second")
	mu.Lock()
	now = now.Add(1100 * time.Millisecond)
	mu.Unlock()
	v, err = fa.View(ctx)
	require.NoError(t, err)
	assert.Len(t, v.Instances, 1, "pod-b left")
}

func TestFleetConfigErrors(t *testing.T) {
	f := newFixture(t, []observe.Option{observe.WithWindow(time.Minute)})
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	_, err := observe.NewFleet(f.obs, nil)
	assert.ErrorIs(t, err, observe.ErrBadOption, "no redis")
	for name, opts := range map[string][]observe.FleetOption{
		"interval":           {observe.WithReportInterval(time.Millisecond)},
		"ttl under interval": {observe.WithReportInterval(5 * time.Second), observe.WithReportTTL(5 * time.Second)},
		"fractional step":    {observe.WithTrend(1500*time.Millisecond, 30)},
		"beyond the window":  {}, // 30 × 10s > 1 minute
		"too many subjects":  {observe.WithTopSubjects(1000)},
		"too many points":    {observe.WithTrend(time.Second, 1000)},
		"bad prefix":         {observe.WithKeyPrefix("a b")},
	} {
		_, err := observe.NewFleet(f.obs, rdb, opts...)
		assert.ErrorIs(t, err, observe.ErrBadOption, name)
	}
	_, err = observe.NewFleet(f.obs, rdb, observe.WithTrend(time.Second, 60))
	assert.NoError(t, err)
}

// fleetACL is the least-privilege ACL of docs/operations.md, "Least privilege", for the fleet
// reports: a selector gives the plain commands the reports need on their keys only.
var fleetACL = []any{"on", ">pw", "resetkeys", "resetchannels", "~hr:*", "&hr:*", "-@all", "+ping", "+hello",
	"(~hr:v3:x:{dashboard}* +set +mget +del +zadd +zrem +zrevrangebyscore +zremrangebyscore +pexpire)"}

// TestFleetUnderLeastPrivilegeACL: reports are written, read and removed by a user whose plain
// writes reach only the fleet's keys.
func TestFleetUnderLeastPrivilegeACL(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, append([]any{"ACL", "SETUSER", "lim"}, fleetACL...)...)
	rdb := srv.Client(t, redistest.As("lim", "pw"))
	ctx := context.Background()
	f := newFixture(t, []observe.Option{observe.WithInstance("pod-a")})
	fl, err := observe.NewFleet(f.obs, rdb, observe.WithReportInterval(time.Second))
	require.NoError(t, err)
	require.NoError(t, fl.Publish(ctx))
	v, err := fl.View(ctx)
	require.NoError(t, err)
	require.Len(t, v.Instances, 1)
	rctx, cancel := context.WithCancel(ctx)
	cancel()
	fl.Run(rctx) // publishes once, then removes the report
	aclLog, _ := srv.Do(t, "ACL", "LOG").([]any)
	assert.Empty(t, aclLog, "no command was refused")
	err = rdb.Set(ctx, "hr:v4:b:{x}", "v", 0).Err()
	require.Error(t, err, "a plain write elsewhere in the prefix")
	assert.Contains(t, err.Error(), "NOPERM")
}

// TestFleetReportIsBounded: however many rules deny and subjects are denied, a report carries at
// most 32 rules (the rest as "other") and Subjects ids, and stays near 10 KB.
func TestFleetReportIsBounded(t *testing.T) {
	var pol strings.Builder
	pol.WriteString("version: 1\nrules:\n")
	for i := 0; i < 40; i++ {
		fmt.Fprintf(&pol, "  - {id: rule-%02d, dimensions: [api_key], match: {routes: [\"GET /r%02d\"]}, rate: 0.001, burst: 1}\n", i, i)
	}
	f := newFixture(t, nil)
	p, err := policy.Parse([]byte(pol.String()), "many.yaml")
	require.NoError(t, err)
	require.NoError(t, f.obs.SetPolicy(p))
	for i := 0; i < 40; i++ {
		for k := 0; k < 30; k++ {
			for j := 0; j < 2; j++ { // burst 1: the second is denied
				f.check(t, fmt.Sprintf("key-%d", k), fmt.Sprintf("GET /r%02d", i), "")
			}
		}
	}
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	fl, err := observe.NewFleet(f.obs, rdb, observe.WithReportID("big"))
	require.NoError(t, err)
	require.NoError(t, fl.Publish(context.Background()))
	body, err := rdb.Get(context.Background(), "hr:v3:x:{dashboard}:big").Result()
	require.NoError(t, err)
	var r observe.Report
	require.NoError(t, json.Unmarshal([]byte(body), &r))
	require.Len(t, r.Trend.Rules, 32)
	assert.Equal(t, observe.Other, r.Trend.Rules[31].Rule)
	var denied, first int64
	for _, n := range r.Trend.Denied {
		denied += n
	}
	for _, rt := range r.Trend.Rules[:31] {
		first += rt.N
	}
	assert.Positive(t, r.Trend.Rules[31].N)
	assert.Equal(t, denied-first, r.Trend.Rules[31].N, "the 9 least denied rules added up")
	assert.Len(t, r.Subjects, observe.DefaultFleetSubjects)
	assert.Less(t, len(body), 12<<10)
	t.Logf("a report with 40 denying rules and 1,200 denied subjects: %d bytes", len(body))
}
