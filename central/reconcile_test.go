package central

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/lua"
)

// forEachBackend runs fn on miniredis and on a real redis-server, because gopher-lua is not Redis's Lua.
func forEachBackend(t *testing.T, fn func(t *testing.T, rdb redis.UniversalClient)) {
	t.Helper()
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, _ bool) { fn(t, rdb) })
}

func testConfig(rdb redis.UniversalClient, node string) Config {
	return Config{
		Client: rdb, Prefix: "t", NodeID: node,
		SyncTimeout: time.Second, FlushTimeout: 2 * time.Second, MaxBatch: 100,
		PruneAge: time.Minute, Recount: time.Second, ActiveWindow: 20 * time.Second, Horizon: 4 * time.Second,
		Breaker: redisx.BreakerConfig{Threshold: 3, Cooldown: 50 * time.Millisecond},
	}
}

func newTestClient(t *testing.T, rdb redis.UniversalClient, node string) *Client {
	t.Helper()
	c, err := New(testConfig(rdb, node))
	require.NoError(t, err)
	return c
}

// forEachClient runs fn on every backend (forEachBackend) with a client from newTestClient for
// node.
func forEachClient(t *testing.T, node string, fn func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, c *Client)) {
	t.Helper()
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		fn(t, context.Background(), rdb, newTestClient(t, rdb, node))
	})
}

// at pins the scripts' clock to us microseconds (test-only override of Redis TIME).
func (c *Client) at(us int64) { c.keyArgs[len(c.keyArgs)-1] = us }

const t0 = int64(1763771234567891) // a 16-digit microsecond timestamp: real Redis's tostring would round it

// node is one incarnation of a node's entry for a key, numbering its calls like local.Entry.
type node struct {
	c      *Client
	key    string
	lim    Limit
	inc    uint64
	demand float64 // declared demand, tokens/s (1 when zero)
	cum    int64   // consumed (admitted)
	acked  int64   // charged by the last answer
	uacked int64
}

// call sends a call asking for want unused tokens and n now, after consuming `use` more tokens.
func (nd *node) call(t *testing.T, use, want, n int64) State {
	t.Helper()
	nd.cum += use
	d := nd.demand
	if d == 0 {
		d = 1
	}
	st, err := nd.c.Take(context.Background(), Update{Key: nd.key, Limit: nd.lim, Inc: nd.inc,
		Cum: nd.cum, Acked: nd.acked, Used: nd.cum, UAcked: nd.uacked, Demand: d, Want: want, N: n})
	require.NoError(t, err)
	if st.Status != StatusStale {
		nd.acked, nd.uacked = st.Charged, nd.cum
		if st.Status == StatusCovered {
			nd.uacked += n
		}
	}
	return st
}

func TestScriptLeaseScenarios(t *testing.T) {
	forEachClient(t, "a", func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, c *Client) {
		nd := &node{c: c, key: "k", lim: Limit{Rate: 0.5, Burst: 10}, inc: 1}
		rk := BucketKey("t", "k")
		type step struct {
			at           int64 // µs after t0
			use, want, n int64
			status       Status
			charged      int64
			tokens       int64 // micro-tokens after the step
			retry        time.Duration
		}
		steps := []step{
			{at: 0, want: 4, n: 1, status: StatusCovered, charged: 4, tokens: 6_000_000},
			// 4 used from the lease, then 7 more needed now: 6 in the bucket cannot cover it.
			{at: 0, use: 4, want: 7, n: 7, status: StatusDenied, charged: 4, tokens: 6_000_000, retry: 2 * time.Second},
			// 1.5 s later: refill 0.75; 6 consumed beyond the charge (credit) are debt: 6.75 - 6 = 0.75.
			{at: 1_500_000, use: 6, want: 1, n: 1, status: StatusDenied, charged: 10, tokens: 750_000, retry: 500 * time.Millisecond},
			// Refill 0.75 → 1.5: a lease of one token.
			{at: 3_000_000, want: 1, n: 1, status: StatusCovered, charged: 11, tokens: 500_000},
			{at: 2_000_000, status: StatusDone, charged: 11, tokens: 500_000},                     // clock went back: no refill
			{at: 22_000_000, status: StatusDone, charged: 11, tokens: 10_000_000},                 // capped at burst
			{at: 22_000_000, want: 3, status: StatusDone, charged: 13, tokens: 8_000_000},         // unused lease 1 topped up to 3
			{at: 22_000_000, use: 3, want: 0, status: StatusDone, charged: 13, tokens: 8_000_000}, // used within the lease: no charge
		}
		for i, s := range steps {
			c.at(t0 + s.at)
			st := nd.call(t, s.use, s.want, s.n)
			assert.Equal(t, s.status, st.Status, "step %d status", i)
			assert.Equal(t, s.charged, st.Charged, "step %d charged", i)
			assert.Equal(t, s.tokens, st.Tokens, "step %d tokens", i)
			assert.Equal(t, s.retry, st.RetryAfter, "step %d retry", i)
		}
		// The refill timestamp survives the round trip with all 16 digits (tostring would keep 14).
		assert.Equal(t, t0+22_000_000, bucketField(t, rdb, rk, 1), "s must not be rounded")
		assert.Equal(t, int64(13), bucketField(t, rdb, rk, 2), "every admitted token is counted once")
		c.at(0)
		// The TTL is twice the time to refill plus a second: 2·10/0.5 s + 1 s = 41 s.
		ttl, err := rdb.PTTL(ctx, rk).Result()
		require.NoError(t, err)
		assert.InDelta(t, 41*time.Second, ttl, float64(2*time.Second))
	})
}

func TestScriptShareOfTheBurst(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		lim := Limit{Rate: 1000, Burst: 100}
		a := &node{c: newTestClient(t, rdb, "a"), key: "sh", lim: lim, inc: 1, demand: 2.5}
		b := &node{c: newTestClient(t, rdb, "b"), key: "sh", lim: lim, inc: 1, demand: 2.5}
		a.c.at(t0)
		b.c.at(t0)
		// Both nodes declare a demand of 2.5 tokens/s: the key's demand is 5 tokens/s, and each node's
		// lease is at most its share of the burst, 2.5/5 of it.
		a.call(t, 10, 0, 0)
		st := b.call(t, 10, 1000, 0)
		assert.InDelta(t, 5.0, st.Demand, 0.001, "the key's demand")
		assert.Equal(t, int64(10+50), st.Charged, "10 debt and half the burst (1000 wanted)")
		// A key whose demand would take more than the burst over the horizon while under its rate
		// keeps half the bucket in reserve: leases come from the upper half only.
		lim2 := Limit{Rate: 1000, Burst: 100}
		c := &node{c: a.c, key: "res", lim: lim2, inc: 1, demand: 100} // 100/s × 4s > 100, < 1000/s
		st = c.call(t, 0, 400, 0)
		assert.Equal(t, int64(50), st.Charged, "the upper half")
		assert.Equal(t, int64(50_000_000), st.Tokens, "the reserve stays")
		st = c.call(t, 0, 0, 51) // a synchronous take may use the reserve
		assert.Equal(t, StatusCovered, st.Status)
	})
}

func TestScriptFractionalTokensSurvive(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestClient(t, rdb, "a")
		nd := &node{c: c, key: "f", lim: Limit{Rate: 1.0 / 3, Burst: 5}, inc: 1}
		c.at(t0)
		nd.call(t, 0, 5, 5)
		// 250 ms steps at a third of a token per second add up to a third of a token after 1 s.
		var st State
		for i := int64(1); i <= 4; i++ {
			c.at(t0 + i*250_000)
			st = nd.call(t, 0, 0, 0)
		}
		assert.InDelta(t, 333_333, st.Tokens, 1, "1s at 1/3 token/s in four steps")
	})
}

func TestScriptDebtFloorAndRetry(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestClient(t, rdb, "a")
		nd := &node{c: c, key: "d", lim: Limit{Rate: 10, Burst: 20}, inc: 1}
		c.at(t0)
		// The node admitted 70 without a lease (a failure policy): debt, floored at -(burst + rate·advance), here -burst.
		st := nd.call(t, 70, 0, 0)
		assert.Equal(t, int64(-20_000_000), st.Tokens)
		assert.Equal(t, int64(70), st.Charged)
		st = nd.call(t, 0, 5, 5)
		assert.Equal(t, StatusDenied, st.Status)
		assert.Equal(t, 2500*time.Millisecond, st.RetryAfter, "(5 - -20) / 10 per second")
		assert.Equal(t, 4*time.Second, st.ResetAfter, "(20 - -20) / 10")
		assert.Equal(t, int64(70), bucketField(t, rdb, BucketKey("t", "d"), 2), "accounting keeps every consumed token")
	})
}

// TestScriptLeaseAdvance: while a key's demand is under its rate, leases may draw
// on the next Advance of refill: the bucket is lent below zero, down to -Rate·Advance, and the node is
// told what could still be lent. At or over the rate, a node that called before may lend the refill its
// leases hold while they wait (the lend: -Rate/demand, at most -Rate·Advance), not told to the node.
func TestScriptLeaseAdvance(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		cfg := testConfig(rdb, "a")
		cfg.Advance = time.Second
		c, err := New(cfg)
		require.NoError(t, err)
		c.at(t0)
		// Demand 5/s under the rate 10/s: a background renewal may take the burst 20 plus what the
		// demand takes of the next second's refill, 5.
		nd := &node{c: c, key: "adv", lim: Limit{Rate: 10, Burst: 20}, inc: 1, demand: 5}
		st := nd.call(t, 0, 40, 0)
		assert.Equal(t, StatusDone, st.Status)
		assert.Equal(t, int64(25), st.Charged, "burst + demand·Advance")
		assert.Equal(t, int64(0), st.Tokens, "nothing more can be lent: the bucket is at -5, the advance 5")
		assert.Equal(t, int64(-5_000_000), bucketField(t, rdb, BucketKey("t", "adv"), 0), "lent below zero")
		st = nd.call(t, 25, 40, 1) // the lease spent, one more now: the node is known, the advance is lent
		assert.Equal(t, StatusDenied, st.Status)
		assert.Equal(t, 100*time.Millisecond, st.RetryAfter, "the advance (5) covers the bucket's -5 only: one token refills in 0.1 s")
		c.at(t0 + 200_000)
		st = nd.call(t, 0, 40, 1) // two tokens refilled: -3 in the bucket, the advance 5
		assert.Equal(t, StatusCovered, st.Status, "a known node's call may draw on the advance")
		c.at(t0)
		// A node's first call that needs tokens now gets no advance, even under the rate: a burst on
		// a key that was quiet takes at most its burst.
		sync := &node{c: c, key: "sync", lim: Limit{Rate: 10, Burst: 20}, inc: 1, demand: 5}
		st = sync.call(t, 0, 40, 1)
		assert.Equal(t, StatusCovered, st.Status)
		assert.Equal(t, int64(20), st.Charged, "only the burst")
		// The advance follows the demand, up to Rate·Advance.
		slow := &node{c: c, key: "slow", lim: Limit{Rate: 10, Burst: 20}, inc: 1, demand: 0.5}
		st = slow.call(t, 0, 40, 0)
		assert.Equal(t, int64(20), st.Charged, "demand 0.5/s takes no whole token of the next second")
		busy := &node{c: c, key: "busy", lim: Limit{Rate: 10, Burst: 20}, inc: 1, demand: 9.9}
		st = busy.call(t, 0, 80, 0)
		assert.Equal(t, int64(19), st.Charged,
			"demand 9.9/s: burst 20 plus 9 tokens of the next second, less the reserve of half a burst (the demand over the horizon is more than those 29)")
		assert.Equal(t, int64(10_000_000), st.Tokens, "the reserve stays in the bucket")
		at := &node{c: c, key: "at", lim: Limit{Rate: 10, Burst: 20}, inc: 1, demand: 10}
		st = at.call(t, 0, 80, 0)
		assert.Equal(t, int64(20), st.Charged, "demand 10/s, at the rate: no advance")
		// Over the rate (demand 20/s) the advance is not lent either. While other nodes declare
		// demand on the key, a node that called before may lend the refill its leases hold while
		// they wait for its requests instead: Rate/demand tokens below zero, rounded (here 10/20
		// → 1), not told to the node. A node alone on a key lends nothing: no other node holds
		// its tokens.
		alone := &node{c: c, key: "alone", lim: Limit{Rate: 10, Burst: 20}, inc: 1, demand: 20}
		st = alone.call(t, 0, 80, 0)
		assert.Equal(t, int64(20), st.Charged, "the burst")
		st = alone.call(t, 20, 80, 1) // the lease spent, one more now
		assert.Equal(t, StatusDenied, st.Status, "alone on the key: no lend")
		// A node with a small share of the key's demand (declared first here) lends more (its
		// requests are further apart), up to Rate·Advance (10), and takes at most its share of the
		// burst.
		minor := &node{c: c, key: "over", lim: Limit{Rate: 10, Burst: 20}, inc: 1, demand: 0.5}
		mcfg := testConfig(rdb, "minor")
		mcfg.Advance = time.Second
		minor.c, err = New(mcfg)
		require.NoError(t, err)
		minor.c.at(t0)
		minor.call(t, 0, 0, 0) // its first call declares its demand
		hot := &node{c: c, key: "over", lim: Limit{Rate: 10, Burst: 20}, inc: 1, demand: 20}
		st = hot.call(t, 0, 80, 0)
		assert.Equal(t, int64(20), st.Charged, "only the burst: the node's share")
		assert.Equal(t, int64(0), st.Tokens, "the lend is not what could be lent")
		st = hot.call(t, 20, 80, 1) // the lease spent, one more now
		assert.Equal(t, StatusCovered, st.Status, "the lend covers one token")
		assert.Equal(t, int64(-1_000_000), bucketField(t, rdb, BucketKey("t", "over"), 0), "lent one token below zero")
		st = hot.call(t, 1, 80, 1) // and one more
		assert.Equal(t, StatusDenied, st.Status, "no further than the lend")
		assert.Equal(t, 100*time.Millisecond, st.RetryAfter, "the bucket's -1 is the lend: a token refills in 0.1 s")
		st = minor.call(t, 0, 80, 0)
		assert.Equal(t, int64(1), st.Charged, "its share: 20·0.5/20.5 rounds to 0, at least 1")
		assert.Equal(t, int64(-2_000_000), bucketField(t, rdb, BucketKey("t", "over"), 0))
		// Debt floors at -(Burst + Rate·Advance): a lent bucket's debt is never forgiven.
		st = nd.call(t, 100, 0, 0)
		assert.Equal(t, int64(-25_000_000), st.Tokens, "floor -30, plus what the demand takes of the advance, 5")
		// The bucket outlives every lease it lent: its TTL is at least the active window (20 s here),
		// not only twice the refill of burst and advance (2·30/10 s + 1 s = 7 s).
		ttl, err := rdb.PTTL(context.Background(), BucketKey("t", "adv")).Result()
		require.NoError(t, err)
		assert.InDelta(t, 20*time.Second, ttl, float64(2*time.Second))
		// A zero advance is the plain model.
		plain := newTestClient(t, rdb, "b")
		plain.at(t0)
		p := &node{c: plain, key: "plain", lim: Limit{Rate: 10, Burst: 20}, inc: 1, demand: 5}
		st = p.call(t, 0, 40, 1)
		assert.Equal(t, int64(20), st.Charged)
		_, err = New(Config{Client: rdb, Prefix: "t", NodeID: "x", SyncTimeout: time.Second, FlushTimeout: time.Second,
			MaxBatch: 1, PruneAge: time.Minute, Recount: time.Second, ActiveWindow: time.Second, Horizon: time.Second,
			Advance: -time.Second, Breaker: redisx.BreakerConfig{Threshold: 1, Cooldown: time.Second}})
		assert.Error(t, err, "a negative advance")
	})
}

func TestScriptIsIdempotent(t *testing.T) {
	forEachClient(t, "a", func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, c *Client) {
		lim := Limit{Rate: 1, Burst: 100}
		c.at(t0)
		u := Update{Key: "i", Limit: lim, Inc: 1, Cum: 30, Used: 30, Want: 10, Demand: 1}
		for range 3 { // a re-sent call is applied once
			out, errs := make([]State, 1), make([]error, 1)
			require.NoError(t, c.Reconcile(ctx, []Update{u}, out, errs))
			require.NoError(t, errs[0])
			assert.Equal(t, int64(40), out[0].Charged, "30 debt and a lease of 10")
			assert.Equal(t, int64(60_000_000), out[0].Tokens)
		}
		// A late call (smaller counts) charges and grants nothing either.
		old := u
		old.Cum, old.Used = 20, 20
		out, errs := make([]State, 1), make([]error, 1)
		require.NoError(t, c.Reconcile(ctx, []Update{old}, out, errs))
		assert.Equal(t, int64(40), out[0].Charged)
		assert.Equal(t, int64(60_000_000), out[0].Tokens)
		// A replayed synchronous take: covered both times, taken and counted once.
		tk := Update{Key: "i", Limit: lim, Inc: 1, Cum: 40, Acked: 40, Used: 40, UAcked: 30, Want: 5, N: 5, Demand: 1}
		for range 2 {
			st, err := c.Take(ctx, tk)
			require.NoError(t, err)
			assert.Equal(t, StatusCovered, st.Status)
			assert.Equal(t, int64(45), st.Charged)
			assert.Equal(t, int64(55_000_000), st.Tokens)
		}
		assert.Equal(t, int64(45), bucketField(t, rdb, BucketKey("t", "i"), 2), "30 + 10 + the 5 taken")
	})
}

func TestScriptIncarnations(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestClient(t, rdb, "a")
		lim := Limit{Rate: 1, Burst: 100}
		c.at(t0)
		one := &node{c: c, key: "n", lim: lim, inc: 1}
		one.call(t, 30, 0, 0)
		// The node evicted the key (nothing pending) and starts a new incarnation at 0.
		two := &node{c: c, key: "n", lim: lim, inc: 2}
		st := two.call(t, 5, 0, 0)
		assert.Equal(t, int64(65_000_000), st.Tokens, "new incarnation's 5 applied on top of the old 30")
		// A late call from incarnation 1 changes nothing.
		st = one.call(t, 20, 0, 0)
		assert.Equal(t, StatusStale, st.Status)
		st = two.call(t, 0, 0, 0)
		assert.Equal(t, int64(65_000_000), st.Tokens)
		// After the key expired in Redis, a node's acked seeds what was charged.
		require.NoError(t, rdb.Del(context.Background(), BucketKey("t", "n")).Err())
		st = two.call(t, 3, 0, 0)
		assert.Equal(t, int64(97_000_000), st.Tokens, "only the 3 beyond acked charged to a fresh bucket")
	})
}

func TestScriptPrunesDepartedNodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		lim := Limit{Rate: 1, Burst: 100}
		for i, id := range []string{"a", "b", "c"} {
			nd := &node{c: newTestClient(t, rdb, id), key: "act", lim: lim, inc: 1}
			nd.c.at(t0 + int64(i))
			nd.call(t, 1, 0, 0)
		}
		// After the prune age (1 minute) and a scan period, only the node that keeps calling is left.
		a := &node{c: newTestClient(t, rdb, "a"), key: "act", lim: lim, inc: 1, cum: 1, acked: 1, uacked: 1}
		a.c.at(t0 + 200_000_000)
		a.call(t, 1, 0, 0)
		fields, err := rdb.HKeys(context.Background(), BucketKey("t", "act")).Result()
		require.NoError(t, err)
		var nodes []string
		for _, f := range fields {
			if IsNodeField(f) {
				nodes = append(nodes, f)
			}
		}
		assert.Equal(t, []string{"n:a"}, nodes)
	})
}

// bucketField reads element i of a bucket's "b" field (reconcile.lua: t, s, c, w, nt, x; w in
// milli-tokens/s, rounded down), through ParseBucket.
func bucketField(t *testing.T, rdb redis.UniversalClient, key string, i int) int64 {
	t.Helper()
	b, err := rdb.HGet(context.Background(), key, BucketField).Result()
	require.NoError(t, err)
	st, err := ParseBucket(b)
	require.NoError(t, err, "%q", b)
	return [...]int64{st.Tokens, st.Refilled, st.Consumed, int64(st.Demand * 1000), st.NextScan, st.TTLSet}[i]
}

func TestScriptRejectsBadNumbers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		src := redis.NewScript(lua.StripShebang(lua.Reconcile()))
		nan, inf := math.NaN(), math.Inf(1)
		for _, tc := range []struct {
			name string
			arg  []byte // a key's packed argument (see packed); nil: ok below, cut short
		}{
			{"nan rate", packed(1, 0, 0, 0, 0, 1, 1, 1, nan, 10)},
			{"inf rate", packed(1, 0, 0, 0, 0, 1, 1, 1, inf, 10)},
			{"negative rate", packed(1, 0, 0, 0, 0, 1, 1, 1, -1, 10)},
			{"zero burst", packed(1, 0, 0, 0, 0, 1, 1, 1, 1, 0)},
			{"fractional burst", packed(1, 0, 0, 0, 0, 1, 1, 1, 1, 2.5)},
			{"n over burst", packed(1, 0, 0, 0, 0, 1, 1, 11, 1, 10)},
			{"nan cum", packed(1, nan, 0, 0, 0, 1, 1, 1, 1, 10)},
			{"inf cum", packed(1, inf, 0, 0, 0, 1, 1, 1, 1, 10)},
			{"fractional cum", packed(1, 0.5, 0, 0, 0, 1, 1, 1, 1, 10)},
			{"used over cum", packed(1, 1, 0, 2, 0, 1, 1, 1, 1, 10)},
			{"negative inc", packed(-1, 0, 0, 0, 0, 1, 1, 1, 1, 10)},
			{"nan demand", packed(1, 0, 0, 0, 0, nan, 1, 1, 1, 10)},
			{"negative demand", packed(1, 0, 0, 0, 0, -1, 1, 1, 1, 10)},
			{"fractional n", packed(1, 0, 0, 0, 0, 1, 1, 0.5, 1, 10)},
			{"short argument", packed(1, 0, 0, 0, 0, 1, 1, 1, 1, 10)[:79]},
			{"long argument", append(packed(1, 0, 0, 0, 0, 1, 1, 1, 1, 10), 0)},
			{"text argument", []byte("1")},
		} {
			args := []any{NodeField("node"), 60000, 1000, 4000, 4000, 0, 0, 0, tc.arg}
			res, err := src.Eval(ctx, rdb, []string{"t:" + Version + ":b:{bad}:1:10"}, args...).Result()
			require.NoError(t, err, tc.name)
			out, errs := make([]State, 1), make([]error, 1)
			require.NoError(t, decodeStates(res, out, errs), tc.name)
			require.ErrorIs(t, errs[0], ErrBadKey, tc.name)
			assert.Contains(t, errs[0].Error(), "hybridrate: bad", tc.name)
		}
		n, err := rdb.Exists(ctx, "t:"+Version+":b:{bad}:1:10").Result()
		require.NoError(t, err)
		assert.Equal(t, int64(0), n, "a rejected key writes nothing")
		// The same argument, well-formed, is applied: the cases above fail on their one bad value.
		res, err := src.Eval(ctx, rdb, []string{"t:" + Version + ":b:{bad}:1:10"}, NodeField("node"), 60000, 1000, 4000, 4000, 0, 0, 0,
			packed(1, 0, 0, 0, 0, 1, 1, 1, 1, 10)).Result()
		require.NoError(t, err)
		out, errs := make([]State, 1), make([]error, 1)
		require.NoError(t, decodeStates(res, out, errs))
		require.NoError(t, errs[0])
		assert.Equal(t, StatusCovered, out[0].Status)
		require.NoError(t, rdb.Del(ctx, "t:"+Version+":b:{bad}:1:10").Err())
		// A bad global argument fails the whole call.
		err = src.Eval(ctx, rdb, []string{"t:" + Version + ":b:{bad}:1:10"}, "no:de", 60000, 1000, 4000, 4000, 0, 0, 0,
			packed(1, 0, 0, 0, 0, 1, 1, 1, 1, 10)).Err()
		require.Error(t, err)
		// So does a call with ten text numbers per key (the protocol before the packed argument).
		err = src.Eval(ctx, rdb, []string{"t:" + Version + ":b:{bad}:1:10"}, NodeField("node"), 60000, 1000, 4000, 4000, 0, 0, 0,
			1, 0, 0, 0, 0, 1, 1, 1, "1", 10).Err()
		require.ErrorContains(t, err, "want 9 arguments")
		// Go rejects bad limits before they are sent.
		c := newTestClient(t, rdb, "a")
		for _, lim := range []Limit{{math.NaN(), 1}, {math.Inf(1), 1}, {-1, 1}, {1, 0}} {
			_, err := c.Take(ctx, Update{Key: "x", Limit: lim, N: 1})
			assert.Error(t, err)
			assert.False(t, redisx.IsTransport(err))
		}
	})
}

// packed returns a key's script argument: the ten values as little-endian float64s (appendArgs).
func packed(v ...float64) []byte {
	b := make([]byte, 0, 8*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return b
}

// TestOneBadKeyCostsOnlyThatKey: a key whose Redis value has the wrong type (WRONGTYPE) fails alone;
// the other keys of the same script call are applied (issue 11, item 2).
func TestOneBadKeyCostsOnlyThatKey(t *testing.T) {
	forEachClient(t, "a", func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, c *Client) {
		lim := Limit{Rate: 1, Burst: 100}
		require.NoError(t, rdb.Set(ctx, BucketKey("t", "poisoned"), "x", 0).Err())
		var ups []Update
		for _, k := range []string{"ok1", "poisoned", "ok2"} {
			ups = append(ups, Update{Key: k, Limit: lim, Inc: 1, Cum: 5, Used: 5})
		}
		out, errs := make([]State, 3), make([]error, 3)
		err := c.Reconcile(ctx, ups, out, errs)
		require.ErrorIs(t, err, ErrBadKey)
		assert.NoError(t, errs[0])
		assert.ErrorIs(t, errs[1], ErrBadKey)
		assert.Contains(t, errs[1].Error(), "WRONGTYPE")
		assert.NoError(t, errs[2])
		for _, k := range []string{"ok1", "ok2"} {
			assert.Equal(t, int64(5), bucketField(t, rdb, BucketKey("t", k), 2), k)
		}
		assert.Equal(t, redisx.BreakerClosed, c.Breaker().State(), "a bad key says nothing about Redis")
	})
}

// TestUserKeysCannotReachInternalStructures: no user key, whatever its bytes, names the ban list or
// any other structure of the limiter's own (issue 11, item 1).
func TestUserKeysCannotReachInternalStructures(t *testing.T) {
	internal := []string{BansKey("hr"), BansChannel("hr")}
	for _, k := range []string{"bans", "{bans}", "x:bans", "ts", "nt", "tk", "t", "s", "c", "w", "b", "x",
		"n:a", "hr:v3:x:{bans}", "}:1:1", "bans}:1:1"} {
		for _, in := range internal {
			assert.NotEqual(t, in, BucketKey("hr", k), k)
		}
		assert.True(t, strings.HasPrefix(BucketKey("hr", k), "hr:v6:b:{"), k)
	}
	for _, in := range internal {
		assert.True(t, strings.HasPrefix(in, "hr:v3:x:"), in)
	}
}

func TestNoScriptRecovery(t *testing.T) {
	forEachClient(t, "a", func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, c *Client) {
		lim := Limit{Rate: 1, Burst: 100}
		nd := &node{c: c, key: "s", lim: lim, inc: 1}
		nd.call(t, 0, 0, 1)
		for round := 0; round < 2; round++ {
			require.NoError(t, rdb.ScriptFlush(ctx).Err())
			loads := c.Stats().ScriptLoads.Load()
			nd.cum += 2
			ups := []Update{{Key: "s", Limit: lim, Inc: 1, Cum: nd.cum, Acked: nd.acked, Used: nd.cum, UAcked: nd.uacked}}
			out, errs := make([]State, 1), make([]error, 1)
			require.NoError(t, c.Reconcile(ctx, ups, out, errs), "pipelined reconcile after SCRIPT FLUSH")
			require.NoError(t, errs[0])
			assert.Equal(t, nd.cum, out[0].Charged)
			nd.acked, nd.uacked = out[0].Charged, nd.cum
			assert.Greater(t, c.Stats().ScriptLoads.Load(), loads, "the script was reloaded")
			require.NoError(t, rdb.ScriptFlush(ctx).Err())
			st := nd.call(t, 0, 1, 1)
			assert.Equal(t, StatusCovered, st.Status, "take after SCRIPT FLUSH")
		}
	})
}

func TestReconcileBatchesManyKeys(t *testing.T) {
	forEachClient(t, "a", func(t *testing.T, ctx context.Context, _ redis.UniversalClient, c *Client) {
		const n = 250 // three script calls of at most 100 keys
		ups := make([]Update, n)
		for i := range ups {
			ups[i] = Update{Key: "b" + strconv.Itoa(i), Limit: Limit{Rate: 100, Burst: 1000}, Inc: 1, Cum: int64(i), Used: int64(i)}
		}
		ups[7].Limit.Rate = math.NaN() // one bad update fails alone
		out, errs := make([]State, n), make([]error, n)
		err := c.Reconcile(ctx, ups, out, errs)
		require.Error(t, err)
		for i := range ups {
			if i == 7 {
				assert.Error(t, errs[i])
				continue
			}
			require.NoError(t, errs[i], i)
			assert.Equal(t, int64(i), out[i].Charged, i)
			assert.Equal(t, (1000-int64(i))*1_000_000, out[i].Tokens, i)
		}
	})
}

func TestBreakerOpensAndFailsFast(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, redistest.NoRetries)
	c := newTestClient(t, rdb, "a")
	ctx := context.Background()
	nd := &node{c: c, key: "br", lim: Limit{Rate: 1, Burst: 10}, inc: 1}
	nd.call(t, 0, 1, 1)
	srv.Kill(t)
	for i := 0; i < 3; i++ {
		_, err := c.Take(ctx, Update{Key: "br", Limit: Limit{Rate: 1, Burst: 10}, Inc: 1, N: 1})
		require.Error(t, err)
		assert.True(t, redisx.IsTransport(err), "%v", err)
	}
	assert.Equal(t, redisx.BreakerOpen, c.Breaker().State())
	start := time.Now()
	_, err := c.Take(ctx, Update{Key: "br", Limit: Limit{Rate: 1, Burst: 10}, Inc: 1, N: 1})
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.Less(t, time.Since(start), 10*time.Millisecond, "an open breaker does no I/O")
	srv.Restart(t)
	require.Eventually(t, func() bool {
		_, err := c.Take(ctx, Update{Key: "br", Limit: Limit{Rate: 1, Burst: 10}, Inc: 1, N: 1})
		return err == nil
	}, 5*time.Second, 20*time.Millisecond)
	assert.Equal(t, redisx.BreakerClosed, c.Breaker().State())
}

func TestKeysAndSlots(t *testing.T) {
	assert.Equal(t, "hr:v6:b:{user:1}", BucketKey("hr", "user:1"), "the limit is not part of the name")
	assert.Equal(t, uint16(0x31C3), redisx.CRC16("123456789"), "CRC-16/XMODEM check value")
	assert.Equal(t, redisx.Slot("bar"), redisx.Slot("x{bar}y"))
	assert.Equal(t, redisx.Slot("a{}b"), int(redisx.CRC16("a{}b")&16383), "empty tag hashes the whole key")
	assert.NotEqual(t, BucketKey("hr", "a}b"), BucketKey("hr", "a"), "different keys stay different")
	for _, p := range []string{"", "a{", "b}", "c d"} {
		assert.False(t, redisx.ValidPrefix(p), p)
	}
}

// TestExtremeRatesReachTheScript pins the rate's wire format: no exponent ("1e+09" is not a number
// to gopher-lua) and all digits of a fractional rate.
func TestExtremeRatesReachTheScript(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestClient(t, rdb, "a")
		for i, lim := range []Limit{{1e9, 1e9}, {1e-6, 1}, {123.456789, 7}, {1.0 / 3, 1}} {
			c.at(t0)
			nd := &node{c: c, key: "rate" + strconv.Itoa(i), lim: lim, inc: 1}
			st := nd.call(t, 0, 1, 1)
			assert.Equal(t, StatusCovered, st.Status, "%v", lim)
			assert.Equal(t, (lim.Burst-1)*1_000_000, st.Tokens, "%v", lim)
			c.at(t0 + 1_000_000)
			st = nd.call(t, 1, 0, 0)
			want := float64(lim.Burst-1)*1e6 + lim.Rate*1e6
			assert.InDelta(t, math.Min(want, float64(lim.Burst)*1e6), float64(st.Tokens), 1, "%v: one second of refill", lim)
		}
	})
}

// TestTakeMatchesReconcile (issue 21): one-off takes (take.lua) and reconcile.lua share one bucket:
// a one-off take is counted, refills as reconcile.lua's state does, leaves no node record, denies
// exactly when the bucket cannot cover n (writing nothing), and sets the same TTL; a node's
// reconcile then sees the bucket the takes left, and a one-off take draws on the advance on the
// same terms as a renewal (the key's declared demand under its rate).
func TestTakeMatchesReconcile(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, real bool) {
		ctx := context.Background()
		now := t0
		cfg := testConfig(rdb, "a")
		cfg.ScriptNow = func() int64 { return now }
		cfg.Advance = time.Second
		c, err := New(cfg)
		require.NoError(t, err)
		lim := Limit{Rate: 2, Burst: 4}
		key := BucketKey("t", "k")
		for i := range 4 {
			st, err := c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
			require.NoError(t, err)
			assert.Equal(t, StatusCovered, st.Status, "take %d", i)
			assert.EqualValues(t, (3-i)*1_000_000, st.Tokens, "take %d", i)
		}
		st, err := c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusDenied, st.Status)
		assert.Equal(t, 500*time.Millisecond, st.RetryAfter, "one token at 2/s")
		fields, err := rdb.HKeys(ctx, key).Result()
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"b", "o"}, fields, "no node record; the one-off demand")
		if real {
			ttl, err := rdb.PTTL(ctx, key).Result()
			require.NoError(t, err)
			// reconcile.lua's TTL: 2·(burst + rate·advance)/rate s + 1 s, at least the active window.
			assert.InDelta(t, float64(max(2000*(4+2)/2+1000, cfg.ActiveWindow.Milliseconds())), float64(ttl.Milliseconds()), 50)
		}
		b, err := rdb.HGet(ctx, key, "b").Result()
		require.NoError(t, err)
		bk, err := ParseBucket(b)
		require.NoError(t, err)
		assert.EqualValues(t, 4, bk.Consumed, "the takes are counted")

		// 3 s later the bucket is full again (4 tokens) and the takes' demand has decayed to
		// 4·e⁻³ ≈ 0.2 tokens/s; a node's reconcile reads the takes' state and leases all 4.
		now += 3e6
		n := &node{c: c, key: "k", lim: lim, inc: 1}
		st = n.call(t, 0, 4, 4)
		assert.Equal(t, StatusCovered, st.Status)
		assert.InDelta(t, 1+4*math.Exp(-3), st.Demand, 0.002, "the node's declared demand and the one-off takes'")
		// The nodes' declared demand, 1 token/s, is under the key's rate: like its renewals, a
		// one-off take may draw on the coming refill of the advance (1 s × 1 token/s), once, then it
		// is denied. (Whether the key is under its rate is read from the declared demand alone: a
		// node leaving one-off takes declares their rate, which the o field still counts.)
		st, err = c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusCovered, st.Status, "the advance lent under the rate")
		assert.EqualValues(t, -1_000_000, st.Tokens)
		st, err = c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusDenied, st.Status, "the reconcile and the advance took what there was")
		assert.Equal(t, 500*time.Millisecond, st.RetryAfter, "from -1 to 0 at 2/s: then the advance covers a token again")
	})
}

// TestOneOffTakesCountInTheKeysDemand (issue 21): the nodes on one-off takes keep no record and
// declare no demand, so take.lua counts what they take in the key's one-off demand (the bucket's o
// field, a rate decayed over a second), and reconcile.lua sizes a leasing node's share by the
// declared demand plus that rate. Without it, the first nodes of a fleet to lease a key read their
// share as most of it while the rest of the fleet was still on one-off takes (hot keys on 512
// nodes: 0.64% false denials, all in the keys' first seconds).
func TestOneOffTakesCountInTheKeysDemand(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, real bool) {
		ctx := context.Background()
		now := t0
		cfg := testConfig(rdb, "a")
		cfg.ScriptNow = func() int64 { return now }
		c, err := New(cfg)
		require.NoError(t, err)
		lim := Limit{Rate: 100, Burst: 100}
		for i := range 30 {
			st, err := c.Take(ctx, Update{Key: "k", Limit: lim, Want: 1, N: 1})
			require.NoError(t, err)
			require.Equal(t, StatusCovered, st.Status)
			assert.InDelta(t, float64(i+1), st.Demand, 0.001, "take %d: each take adds n/τ to the rate", i)
		}
		// A node declaring 10 tokens/s asks for 100: the key's demand is 10 + 30 = 40 tokens/s and
		// its share floor(100·10/40 + ½) = 25 of the 70 tokens left. (Counting the declared demand
		// alone, its share was the whole burst and it leased all 70.) The reserve and the advance
		// read whether the key is under its rate from the declared demand (10 tokens/s over the 4 s
		// horizon is under the burst: no reserve).
		n := &node{c: c, key: "k", lim: lim, inc: 1, demand: 10}
		st := n.call(t, 0, 100, 0)
		assert.EqualValues(t, 25, st.Charged, "the lease")
		assert.InDelta(t, 40, st.Demand, 0.001)
		// The rate decays with a time constant of a second: 2 s later the one-off takes count
		// 30·e⁻² ≈ 4.06 tokens/s.
		now += 2e6
		st = n.call(t, 0, 20, 0)
		assert.InDelta(t, 10+30*math.Exp(-2), st.Demand, 0.002)
	})
}

// TestLimitChangeKeepsTheBucket (issue 23, item 2): the limit is not part of a bucket's name, so a
// call with a new limit finds the consumption of the old one: tokens clamped to a lower burst, a
// raised burst filling at the new rate from the change on, and two nodes sending different limits
// for one key counting in one bucket.
func TestLimitChangeKeepsTheBucket(t *testing.T) {
	forEachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		now := t0
		client := func(id string) *Client {
			cfg := testConfig(rdb, id)
			cfg.ScriptNow = func() int64 { return now } // takes and reconciles on one test clock
			c, err := New(cfg)
			require.NoError(t, err)
			return c
		}
		a, b := client("a"), client("b")
		old, raised := Limit{Rate: 1, Burst: 3}, Limit{Rate: 0.1, Burst: 4}
		na := &node{c: a, key: "k", lim: old, inc: 1}
		st := na.call(t, 0, 3, 3)
		require.Equal(t, StatusCovered, st.Status)
		assert.EqualValues(t, 0, st.Tokens, "the old limit's burst is spent")

		// Node b runs the raised limit on the same key: same bucket, nothing to lend.
		nb := &node{c: b, key: "k", lim: raised, inc: 1}
		now = t0 + 1_000_000 // 1 s later, at the caller's rate: 0.1 token
		st = nb.call(t, 0, 1, 1)
		assert.Equal(t, StatusDenied, st.Status, "a raised burst is not a fresh bucket")
		assert.EqualValues(t, 100_000, st.Tokens, "refilled at the new rate")
		assert.Equal(t, 9*time.Second, st.RetryAfter, "0.9 token at 0.1/s")
		st, err := b.Take(ctx, Update{Key: "k", Limit: raised, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusDenied, st.Status, "a one-off take under the new limit too")

		// 100 s later the bucket is full under the new burst (4), not the old one (3).
		now = t0 + 101_000_000
		st = nb.call(t, 0, 4, 4)
		assert.Equal(t, StatusCovered, st.Status, "the raised burst fills at the new rate")
		assert.EqualValues(t, 0, st.Tokens)

		// Node a, still on the old limit, finds what b left: one bucket for both.
		st = na.call(t, 3, 1, 1)
		assert.Equal(t, StatusDenied, st.Status, "the old limit's node counts in the same bucket")

		// A lower burst clamps what the bucket holds.
		now = t0 + 1_000_000_000
		st = nb.call(t, 0, 0, 0)
		assert.EqualValues(t, 4_000_000, st.Tokens)
		low := Limit{Rate: 0.1, Burst: 2}
		st, err = b.Take(ctx, Update{Key: "k", Limit: low, Want: 2, N: 2})
		require.NoError(t, err)
		assert.Equal(t, StatusCovered, st.Status)
		assert.EqualValues(t, 0, st.Tokens, "clamped to the lower burst, then 2 taken")

		keys, err := rdb.Keys(ctx, "t:*").Result()
		require.NoError(t, err)
		assert.Equal(t, []string{BucketKey("t", "k")}, keys, "one Redis key for every limit")
	})
}

// TestBanInTheBucket (issue 23, item 6): a ban is written into the key's bucket, and every script
// that admits (reconcile.lua's leases and takes, take.lua) reads it in the same HMGET: a banned key
// gets nothing from Redis whatever the node's local copy of the ban list holds; the node's report
// is still applied; Unban lifts it.
func TestBanInTheBucket(t *testing.T) {
	forEachClient(t, "a", func(t *testing.T, ctx context.Context, rdb redis.UniversalClient, c *Client) {
		lim := Limit{Rate: 10, Burst: 10}
		nd := &node{c: c, key: "k", lim: lim, inc: 1}
		st := nd.call(t, 0, 2, 1) // a bucket with a node record before the ban
		require.Equal(t, StatusCovered, st.Status)

		require.NoError(t, c.Ban(ctx, "k", time.Minute))
		require.NoError(t, c.Ban(ctx, "fresh", time.Minute)) // no bucket yet
		st = nd.call(t, 1, 5, 1)
		assert.Equal(t, StatusBanned, st.Status, "a leasing take of a banned key")
		assert.EqualValues(t, 2, st.Charged, "nothing granted: the lease is what it was")
		assert.InDelta(t, time.Minute.Seconds(), st.RetryAfter.Seconds(), 2, "retry: the ban's remaining time")
		st = nd.call(t, 0, 5, 0)
		assert.Equal(t, StatusBanned, st.Status, "a background reconcile of a banned key")
		assert.EqualValues(t, 2, st.Charged)
		st = nd.call(t, 4, 0, 0)
		assert.EqualValues(t, 5, st.Charged, "consumption beyond the lease (1 + 4 > 2) is still charged as debt")
		for _, key := range []string{"k", "fresh"} {
			st, err := c.Take(ctx, Update{Key: key, Limit: lim, Want: 1, N: 1})
			require.NoError(t, err)
			assert.Equal(t, StatusBanned, st.Status, "%s: a one-off take (take.lua)", key)
			st, err = c.Take(ctx, Update{Key: key, Limit: lim, Want: 1, N: 1, Inc: 7})
			require.NoError(t, err)
			assert.Equal(t, StatusBanned, st.Status, "%s: a node's first leasing take", key)
			out, errs := make([]State, 1), make([]error, 1)
			require.NoError(t, c.Reconcile(ctx, []Update{{Key: key, Limit: lim, Want: 1}}, out, errs))
			assert.Equal(t, StatusBanned, out[0].Status, "%s: a one-off take (reconcile.lua, inc 0)", key)
		}
		if ttl, err := rdb.PTTL(ctx, BucketKey("t", "fresh")).Result(); assert.NoError(t, err) && ttl > 0 {
			assert.Greater(t, ttl, 59*time.Second, "the bucket keeps the ban as long as it lasts")
		}

		ok, err := c.DeleteBucket(ctx, "k", lim)
		require.NoError(t, err)
		assert.True(t, ok)
		st = (&node{c: c, key: "k", lim: lim, inc: 8}).call(t, 0, 2, 1)
		assert.Equal(t, StatusBanned, st.Status, "deleting the bucket (Reset) keeps the ban")
		require.NoError(t, c.Ban(ctx, "only", time.Minute))
		ok, err = c.DeleteBucket(ctx, "only", lim)
		require.NoError(t, err)
		assert.False(t, ok, "a bucket that holds only a ban is no bucket")
		st, err = c.Take(ctx, Update{Key: "only", Limit: lim, Want: 1, N: 1})
		require.NoError(t, err)
		assert.Equal(t, StatusBanned, st.Status, "and its ban stays")

		require.NoError(t, c.Unban(ctx, "k"))
		st = (&node{c: c, key: "k", lim: lim, inc: 9}).call(t, 0, 2, 1)

		assert.Equal(t, StatusCovered, st.Status, "unbanned")
	})
}
