package relay_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a monotonic clock the test moves.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() int64          { return c.ns.Load() + 1 }
func (c *fakeClock) add(d time.Duration) { c.ns.Add(int64(d)) }
func newRelay(t testing.TB, rdb redis.UniversalClient, prefix, node string, opts ...relay.Option) *relay.Relay {
	t.Helper()
	r, err := relay.New(relay.ClientConfig(rdb, prefix, node), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// clockedRelay returns a relay named "relay" under prefix, with opts, on a fresh redis-server (and
// a client of it), on a clock the test moves.
func clockedRelay(t *testing.T, prefix string, opts ...relay.Option) (*redistest.Server, *redis.Client, *relay.Relay, *fakeClock) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clk := &fakeClock{}
	return srv, rdb, newRelay(t, rdb, prefix, "relay", append([]relay.Option{relay.WithClock(clk.now)}, opts...)...), clk
}

// runRelays runs the relays' loops until the test ends: they stop in t.Cleanup, after what the
// test registers later (its children) is closed.
func runRelays(t *testing.T, relays ...*relay.Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range relays {
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// newChildren returns n limiters on rdb under prefix, child i with upstream ups[i%len(ups)], node
// ID name-i and opts; they are closed in t.Cleanup.
func newChildren(t *testing.T, rdb redis.UniversalClient, prefix, name string, n int, ups []hybrid.Upstream, opts ...hybrid.Option) []*hybrid.Limiter {
	t.Helper()
	kids := make([]*hybrid.Limiter, n)
	for i := range kids {
		l, err := hybrid.New(rdb, append([]hybrid.Option{hybrid.WithKeyPrefix(prefix), hybrid.WithUpstream(ups[i%len(ups)]),
			hybrid.WithNodeID(fmt.Sprintf("%s-%d", name, i))}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		kids[i] = l
	}
	return kids
}

// awaitReady waits (up to 5s each) until every child is Ready: it has read the ban list and
// counted the fleet. Children that are not yet give new keys no cold-start credit (issue 23): a
// test starts its load once they are, as a service would.
func awaitReady(kids []*hybrid.Limiter) {
	for _, l := range kids {
		for deadline := time.Now().Add(5 * time.Second); !l.Ready() && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
}

// drive has every child ask for each of keys under limit once every `every`, from a goroutine of
// its own, until run has passed, and calls count (concurrently) with each decision and its key's
// index; a failed call fails t and stops its child. It returns the seconds that passed.
func drive(t *testing.T, kids []*hybrid.Limiter, every, run time.Duration, keys []string, limit hybrid.Limit, count func(key int, d hybrid.Decision)) float64 {
	t.Helper()
	start := time.Now()
	var wg sync.WaitGroup
	for _, l := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for ; time.Since(start) < run; <-tick.C {
				for i, k := range keys {
					d, err := l.Decide(context.Background(), k, limit)
					if err != nil {
						t.Error(err)
						return
					}
					count(i, d)
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start).Seconds()
}

// nodeRecords returns the nodes whose records Redis's bucket of key holds, sorted.
func nodeRecords(t *testing.T, rdb redis.UniversalClient, prefix, key string) []string {
	t.Helper()
	fields, err := rdb.HKeys(context.Background(), central.BucketKey(prefix, key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, f := range fields {
		if n, ok := strings.CutPrefix(f, "n:"); ok {
			nodes = append(nodes, n)
		} else if central.IsNodeField(f) {
			nodes = append(nodes, hex.EncodeToString([]byte(f[1:])))
		}
	}
	slices.Sort(nodes)
	return nodes
}

var lim = central.Limit{Rate: 10, Burst: 20}

// TestRelayHoldsTheLimitAcrossItsChildren: eight limiters behind two relays share one key at four
// times its rate for two seconds; the fleet admits no more than an exact bucket would (within the
// documented bound), and Redis's bucket holds the relays' records, not the children's.
func TestRelayHoldsTheLimitAcrossItsChildren(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const prefix = "rt1"
	relays := []*relay.Relay{newRelay(t, rdb, prefix, "relay-a"), newRelay(t, rdb, prefix, "relay-b")}
	runRelays(t, relays...)
	kids := newChildren(t, rdb, prefix, "child", 8, []hybrid.Upstream{relays[0], relays[1]})
	// (Children without cold-start credit on this key, WithoutColdStart, were admitted 82–120 of 120
	// here on main at ec135b0 too.)
	awaitReady(kids)
	limit := hybrid.Limit{Rate: 50, Burst: 20}
	var admitted, denied atomic.Int64
	// 25 requests/s per child, 200/s in all: four times the rate.
	el := drive(t, kids, 40*time.Millisecond, 2*time.Second, []string{"shared"}, limit, func(_ int, d hybrid.Decision) {
		if d.Allowed {
			admitted.Add(1)
		} else {
			denied.Add(1)
		}
	})
	exact := float64(limit.Burst) + limit.Rate*el
	got := float64(admitted.Load())
	t.Logf("admitted %v, denied %d, exact bucket %.0f over %.2fs", got, denied.Load(), exact, el)
	// docs/accuracy.md's bound for eight nodes is far larger (leases, overdraft and cold-start
	// credits: about 330 tokens here); what a relay must not do is hold its children's inventory a
	// second time, so this checks one lendable amount (Burst + Rate·LeaseAdvance) beyond the exact
	// bucket. Measured: 21–23 tokens over. At four times the rate the fleet must also admit most of
	// what the bucket allows.
	lendable := float64(limit.Burst) + limit.Rate*hybrid.LeaseAdvance.Seconds()
	if got > exact+lendable {
		t.Errorf("admitted %v > exact %.0f + one lendable amount %.0f", got, exact, lendable)
	}
	if got < 0.8*limit.Rate*el {
		t.Errorf("admitted %v < 80%% of the refill (%.0f): the relays starve their children", got, limit.Rate*el)
	}
	nodes := nodeRecords(t, rdb, prefix, "shared")
	if !slices.Equal(nodes, []string{"relay-a", "relay-b"}) {
		t.Errorf("Redis's bucket has the records of %v, want the two relays only", nodes)
	}
}

// TestRelayAnswers checks the protocol a child sees, on a manual clock: a lease within the child's
// share, a replayed call granting nothing twice, a late call from a replaced incarnation, one-off
// takes from the pool, and what is counted in Redis.
func TestRelayAnswers(t *testing.T) {
	_, rdb, r, clk := clockedRelay(t, "rt2", relay.WithFleet(func() int64 { return 2 }))
	ctx := context.Background()
	// A synchronous call for 1 with a want of 8: the pool is empty, so the relay asks Redis.
	u := central.Update{Key: "k", Limit: lim, Inc: 1, Demand: 2, Want: 8, N: 1}
	st, err := r.Take(ctx, "a", u)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != central.StatusCovered || st.Charged < 1 || st.Charged > 8 {
		t.Fatalf("first take: %+v, want covered with a lease of 1 to 8", st)
	}
	if got := r.Stats().SyncCalls; got != 1 {
		t.Errorf("synchronous refills %d, want 1", got)
	}
	// The same call again (a retry): nothing more is charged.
	st2, err := r.Take(ctx, "a", u)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Charged != st.Charged {
		t.Errorf("replayed take charged %d, first %d: want the same", st2.Charged, st.Charged)
	}
	// A late call from incarnation 0 < 1 of the same child is stale... (incarnation 0 is a one-off
	// take), so use a replaced incarnation: the child moves to 2, then 1 comes late.
	if _, err := r.Take(ctx, "b", central.Update{Key: "k", Limit: lim, Inc: 2, Demand: 1, Want: 1, N: 1}); err != nil {
		t.Fatal(err)
	}
	var outs [1]central.State
	var errs [1]error
	if err := r.Reconcile(ctx, "b", []central.Update{{Key: "k", Limit: lim, Inc: 1, Acked: 7, Demand: 1, Want: 1}}, outs[:], errs[:]); err != nil || errs[0] != nil {
		t.Fatal(err, errs[0])
	}
	if outs[0].Status != central.StatusStale || outs[0].Charged != 7 {
		t.Errorf("late call: %+v, want stale with its own acked (7)", outs[0])
	}
	// One-off takes draw on the pool and are counted; the bucket in Redis learns of them at the
	// relay's next round.
	before := r.Stats().SyncCalls
	taken := 0
	for range 30 {
		st, err := r.Take(ctx, "c", central.Update{Key: "k", Limit: lim, N: 1})
		if err != nil {
			t.Fatal(err)
		}
		if st.Status == central.StatusCovered {
			taken++
		}
	}
	if taken == 0 || taken > int(lim.Burst) {
		t.Errorf("one-off takes admitted %d of 30 on a burst of %d", taken, lim.Burst)
	}
	if r.Stats().SyncCalls == before {
		t.Error("one-off takes beyond the pool made no call to Redis")
	}
	clk.add(2 * time.Second)
	if err := r.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	// The relay's record in the bucket (reconcile.lua: inc, chg, used, demand, seen as little-endian
	// integers of 7, 7, 7, 5 and 6 bytes) counts everything admitted: the two leasing takes of 1 and
	// the one-off takes.
	rec, err := rdb.HGet(ctx, central.BucketKey("rt2", "k"), central.NodeField("relay")).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if len(rec) != 32 {
		t.Fatalf("record of %d bytes, want 32", len(rec))
	}
	used := binary.LittleEndian.Uint64(append(rec[14:21:21], 0))
	if int(used) != taken+2 {
		t.Errorf("Redis counted %v admitted, want %d", used, taken+2)
	}
}

// TestRelayMaxKeys: at the cap, a new key is refused with ErrFull and counted; an idle key is
// dropped after ActiveWindow and makes room.
func TestRelayMaxKeys(t *testing.T) {
	_, _, r, clk := clockedRelay(t, "rt3", relay.WithMaxKeys(1), relay.WithActiveWindow(time.Second), relay.WithLeaseLife(500*time.Millisecond))
	ctx := context.Background()
	if _, err := r.Take(ctx, "a", central.Update{Key: "one", Limit: lim, N: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Take(ctx, "a", central.Update{Key: "two", Limit: lim, N: 1}); !errors.Is(err, relay.ErrFull) {
		t.Fatalf("second key at a cap of 1: %v, want ErrFull", err)
	}
	// The pool's lease life ends, its rest is written off and reported; then the idle key goes.
	for range 5 {
		clk.add(time.Second)
		if err := r.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if r.Keys() != 0 {
		t.Fatalf("keys %d after the active window, want 0", r.Keys())
	}
	if _, err := r.Take(ctx, "a", central.Update{Key: "two", Limit: lim, N: 1}); err != nil {
		t.Fatalf("after eviction: %v", err)
	}
	if r.Stats().FullDenied != 1 || r.Stats().Evicted != 1 {
		t.Errorf("stats: full %d evicted %d, want 1 and 1", r.Stats().FullDenied, r.Stats().Evicted)
	}
}

// TestRelayRedisDown: with Redis killed, a child's call that needs Redis gets an error (its
// failure policy decides), the relay's round fails without losing what it must report, and once
// Redis is back everything reaches it.
func TestRelayRedisDown(t *testing.T) {
	srv, _, r, clk := clockedRelay(t, "rt4")
	ctx := context.Background()
	for range 3 {
		if _, err := r.Take(ctx, "a", central.Update{Key: "k", Limit: lim, N: 1}); err != nil {
			t.Fatal(err)
		}
	}
	srv.Kill(t)
	var failed bool
	for range 40 {
		if _, err := r.Take(ctx, "a", central.Update{Key: "k", Limit: lim, N: 1}); err != nil {
			failed = true
			break
		}
	}
	if !failed {
		t.Fatal("40 takes with Redis down all answered: the pool cannot hold that many")
	}
	clk.add(2 * time.Second)
	if err := r.Tick(ctx); err == nil {
		t.Error("a round with Redis down reported no error")
	}
	srv.Restart(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		clk.add(time.Second)
		err := r.Tick(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rounds still fail after the restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r.Stats().Errors == 0 {
		t.Error("no error counted")
	}
}

// TestRelayForwardsRareKeys: a key the relay's children ask for less than a few times per lease
// life holds no pool: once its pool is spent or written off, a one-off take goes to Redis as a
// one-off take (take.lua), counted there at once.
func TestRelayForwardsRareKeys(t *testing.T) {
	_, _, r, clk := clockedRelay(t, "rt5")
	ctx := context.Background()
	take := func() central.State {
		t.Helper()
		st, err := r.Take(ctx, "a", central.Update{Key: "rare", Limit: lim, N: 1})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	take() // first sight: a pool of up to twice what was asked (a relay per host)
	for range 10 {
		clk.add(time.Second) // the pool's lease life ends; its rest is written off
		if err := r.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if st := take(); st.Status != central.StatusCovered {
		t.Fatalf("take after ten quiet seconds: %+v", st)
	}
	if got := r.Stats().Direct; got != 1 {
		t.Errorf("one-off takes forwarded: %d, want 1", got)
	}
}

// TestRelayNewKeysGoDirect: at an owner relay, a new key's first one-off takes go to Redis as one-off takes (a flood of
// keys seen once costs Redis a central bucket's call each, not reconcile.lua and a round); a key
// asked for again within its first second gets a pool, and takes after that are served from it.
func TestRelayNewKeysGoDirect(t *testing.T) {
	// An owner relay (children shard keys over relays); these takes are not vetted against a ban
	// list, so none is admitted on the cold credit: each goes to Redis.
	srv, _, r, clk := clockedRelay(t, "rt7", relay.WithColdCredit(1))
	ctx := context.Background()
	if _, err := r.Take(ctx, "a", central.Update{Key: "warm-up", Limit: lim, N: 1}); err != nil {
		t.Fatal(err) // loads take.lua (EVALSHA, then EVAL on NOSCRIPT)
	}
	before := srv.CommandStats(t)
	for i := range 50 {
		st, err := r.Take(ctx, "a", central.Update{Key: fmt.Sprintf("new-%d", i), Limit: lim, N: 1})
		if err != nil || st.Status != central.StatusCovered {
			t.Fatalf("take %d: %+v, %v", i, st, err)
		}
		clk.add(time.Millisecond)
		if err := r.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.Stats().Direct - 1; got != 50 {
		t.Errorf("new keys' takes forwarded: %d, want 50", got)
	}
	after := srv.CommandStats(t)
	if calls := after["evalsha"] + after["eval"] - before["evalsha"] - before["eval"]; calls != 50 {
		t.Errorf("Redis script calls for 50 keys seen once: %d, want 50 (one take each, no round)", calls)
	}
	// A key asked for a third time in its first second: a pool from then on.
	for i := range 6 {
		st, err := r.Take(ctx, "a", central.Update{Key: "busy", Limit: lim, N: 1})
		if err != nil || st.Status != central.StatusCovered {
			t.Fatalf("busy take %d: %+v, %v", i, st, err)
		}
		clk.add(10 * time.Millisecond)
	}
	if got := r.Stats().Direct - 51; got != 2 {
		t.Errorf("busy key's takes forwarded: %d, want 2", got)
	}
	if got := r.Stats().SyncCalls - 51; got != 3 {
		t.Errorf("busy key's synchronous calls: %d, want 3 (two forwarded, one refill)", got)
	}
}

// TestRelayPrunesDepartedChildren: a child that stopped calling (a restarted pod comes back under
// a new node id) leaves the key's records once it can hold nothing, so a long-lived key does not
// collect a record per pod ever seen.
func TestRelayPrunesDepartedChildren(t *testing.T) {
	_, _, r, clk := clockedRelay(t, "rt6")
	ctx := context.Background()
	for i := range 50 {
		if _, err := r.Take(ctx, fmt.Sprintf("pod-%d", i), central.Update{Key: "k", Limit: lim, Inc: 1, Demand: 1, Want: 1, N: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.Children("k", lim); got != 50 {
		t.Fatalf("%d child records, want 50", got)
	}
	// One pod keeps calling; the others are gone for longer than a lease life and the active window.
	for range 45 {
		clk.add(time.Second)
		if _, err := r.Take(ctx, "pod-0", central.Update{Key: "k", Limit: lim, Inc: 1, Cum: 1, Acked: 1, Used: 1, UAcked: 1, Demand: 1, Want: 1, N: 1}); err != nil {
			t.Fatal(err)
		}
		if err := r.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.Children("k", lim); got != 1 {
		t.Errorf("%d child records after the others left, want 1", got)
	}
}

// TestRelayColdCredit: with Config.ColdCredit, a key's first one-off take at the relay is admitted
// without a Redis call and counted in Redis by the next round, one pipelined call for many keys;
// a key whose bucket does not refill within the active window, or a take larger than the credit,
// goes to Redis as before.
func TestRelayColdCredit(t *testing.T) {
	const prefix = "rt8"
	srv, rdb, r, clk := clockedRelay(t, prefix, relay.WithColdCredit(1))
	ctx := context.Background()
	if _, err := r.Take(ctx, "a", central.Update{Key: "warm-up", Limit: lim, N: 2}); err != nil {
		t.Fatal(err) // over the credit: a one-off take (and take.lua loads)
	}
	if _, err := r.Take(ctx, "a", central.Update{Key: "warm-up-2", Limit: lim, N: 1, Vetted: true}); err != nil {
		t.Fatal(err)
	}
	clk.add(20 * time.Millisecond)
	if err := r.Tick(ctx); err != nil { // reports warm-up-2 (and reconcile.lua loads)
		t.Fatal(err)
	}
	before := srv.CommandStats(t)
	for i := range 40 {
		st, err := r.Take(ctx, "a", central.Update{Key: fmt.Sprintf("new-%d", i), Limit: lim, N: 1, Vetted: true})
		if err != nil || st.Status != central.StatusCovered {
			t.Fatalf("take %d: %+v, %v", i, st, err)
		}
	}
	mid := srv.CommandStats(t)
	if calls := mid["evalsha"] - before["evalsha"]; calls != 0 {
		t.Errorf("%d script calls for 40 new keys' first takes, want 0 (cold credit)", calls)
	}
	if got := r.Stats().Cold - 1; got != 40 {
		t.Errorf("cold admissions: %d, want 40", got)
	}
	clk.add(20 * time.Millisecond)
	if err := r.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	after := srv.CommandStats(t)
	if calls := after["evalsha"] - mid["evalsha"]; calls != 1 {
		t.Errorf("the round reporting 40 keys made %d script calls, want 1", calls)
	}
	for i := range 40 {
		b, err := rdb.HGet(ctx, central.BucketKey(prefix, fmt.Sprintf("new-%d", i)), "b").Result()
		if err != nil {
			t.Fatalf("key new-%d not in Redis after the round: %v", i, err)
		}
		bk, err := central.ParseBucket(b)
		if err != nil || bk.Consumed != 1 {
			t.Fatalf("key new-%d: bucket %+v, %v; want 1 consumed", i, bk, err)
		}
	}
	// A bucket that takes longer than the active window to refill: no cold credit.
	slow := central.Limit{Rate: 0.01, Burst: 5}
	if _, err := r.Take(ctx, "a", central.Update{Key: "slow", Limit: slow, N: 1, Vetted: true}); err != nil {
		t.Fatal(err)
	}
	if got := r.Stats().Cold - 1; got != 40 {
		t.Errorf("a slow-refilling key was admitted on the cold credit")
	}
	// A take its child could not vet against a complete ban list goes to Redis, which reads the
	// key's ban: a banned key is denied, not admitted on the credit.
	c, err := central.New(relay.ClientConfig(rdb, prefix, "admin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Ban(ctx, "banned", time.Minute); err != nil {
		t.Fatal(err)
	}
	st, err := r.Take(ctx, "a", central.Update{Key: "banned", Limit: lim, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status == central.StatusCovered {
		t.Errorf("a banned key's unvetted first take was admitted: %+v", st)
	}
	if got := r.Stats().Cold - 1; got != 40 {
		t.Errorf("an unvetted take was admitted on the cold credit")
	}
}

// TestRelayBanReachesItsPool (issue 23): a key banned after its relay took a pool is not served
// from that pool once the relay's next Redis call for the key is answered: the relay's children
// get StatusBanned with the ban's remaining time (a child denies the key locally until then),
// whatever their own copies of the ban list hold, and a child's report is still applied.
func TestRelayBanReachesItsPool(t *testing.T) {
	const prefix = "rt9"
	_, rdb, r, clk := clockedRelay(t, prefix)
	ctx := context.Background()
	// Child a leases from the relay, which refills its pool from Redis.
	st, err := r.Take(ctx, "a", central.Update{Key: "k", Limit: lim, Inc: 1, Want: 4, N: 1, Demand: 5})
	if err != nil || st.Status != central.StatusCovered {
		t.Fatalf("child a's lease: %+v, %v", st, err)
	}
	charged := st.Charged
	c, err := central.New(relay.ClientConfig(rdb, prefix, "admin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Ban(ctx, "k", time.Minute); err != nil {
		t.Fatal(err)
	}
	// Child b's one-off take: the relay's pool has tokens, so it needs no Redis call before the
	// relay's next round (a child whose ban copy is complete never sends it: it denies locally).
	if _, err := r.Take(ctx, "b", central.Update{Key: "k", Limit: lim, N: 1}); err != nil {
		t.Fatal(err)
	}
	clk.add(100 * time.Millisecond)
	if err := r.Tick(ctx); err != nil { // reports b's take: Redis answers that k is banned
		t.Fatal(err)
	}
	st, err = r.Take(ctx, "b", central.Update{Key: "k", Limit: lim, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != central.StatusBanned || st.RetryAfter <= 50*time.Second || st.RetryAfter > time.Minute {
		t.Errorf("a one-off take of a banned key after the relay's round: %+v, want StatusBanned for about a minute", st)
	}
	st, err = r.Take(ctx, "a", central.Update{Key: "k", Limit: lim, Inc: 1, Acked: charged, Cum: charged, Used: charged, Want: 4, N: 1, Demand: 5})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != central.StatusBanned || st.Charged != charged {
		t.Errorf("child a's leasing take of a banned key: %+v, want StatusBanned and nothing more charged (%d)", st, charged)
	}
	var out [1]central.State
	var errs [1]error
	if err := r.Reconcile(ctx, "a", []central.Update{{Key: "k", Limit: lim, Inc: 1, Acked: charged, Cum: charged + 1, Used: charged + 1, Want: 4, Demand: 5}}, out[:], errs[:]); err != nil || errs[0] != nil {
		t.Fatalf("child a's round: %v %v", err, errs[0])
	}
	if out[0].Status != central.StatusBanned || out[0].Charged != charged+1 {
		t.Errorf("child a's round for a banned key: %+v, want StatusBanned, its overdraft charged (%d)", out[0], charged+1)
	}
	// The ban ends: the key is served again.
	if err := c.Unban(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	clk.add(61 * time.Second)
	st, err = r.Take(ctx, "b", central.Update{Key: "k", Limit: lim, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status == central.StatusBanned {
		t.Errorf("after the ban's time: %+v", st)
	}
}

// TestRelayAdvanceWithinCentrals: the relay lends its children at most the advance Redis lends it
// (its client's): a larger WithAdvance is refused; an equal or smaller one, or none, accepted.
func TestRelayAdvanceWithinCentrals(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // New does no I/O
	t.Cleanup(func() { _ = rdb.Close() })
	cc := relay.ClientConfig(rdb, "adv", "relay")
	if _, err := relay.New(cc, relay.WithAdvance(cc.Advance+time.Millisecond)); !errors.Is(err, relay.ErrBadOption) {
		t.Errorf("WithAdvance over the client's %v: %v, want ErrBadOption", cc.Advance, err)
	}
	for _, d := range []time.Duration{cc.Advance, cc.Advance / 2, 0} {
		if _, err := relay.New(cc, relay.WithAdvance(d)); err != nil {
			t.Errorf("WithAdvance(%v) within the client's %v: %v", d, cc.Advance, err)
		}
	}
	if _, err := relay.New(cc); err != nil {
		t.Errorf("no WithAdvance: %v", err)
	}
}
