package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
)

func Example() {
	// A Redis-compatible server for the example; use your own Redis (or Cluster, or Sentinel) client.
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	m.SetTime(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)) // a fixed Redis TIME keeps the output stable
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	ctx := context.Background()
	lim, err := hybrid.New(rdb,
		hybrid.WithSyncInterval(20*time.Millisecond),
		hybrid.WithDriftThreshold(0.1),
		hybrid.WithFailurePolicy(outcome.LocalFallback),
		hybrid.WithCheckTimeout(time.Second)) // generous for an example on a busy machine; the default is 5ms
	if err != nil {
		panic(err)
	}
	defer lim.Close(ctx)
	// A new limiter reads the ban list and counts its fleet first (milliseconds); until then a new
	// key's first decision goes to Redis, which knows its bans.
	for !lim.Ready() {
		time.Sleep(time.Millisecond)
	}

	limit := hybrid.Limit{Rate: 1, Burst: 3} // 1 token per second, bursts of 3
	for i := 0; i < 4; i++ {
		d, err := lim.Decide(ctx, "user:42", limit)
		if err != nil {
			panic(err)
		}
		// RetryAfter is rounded to the second: it counts from Redis's answer on this process's clock.
		fmt.Printf("allowed=%v remaining=%d retry-after=%v source=%v\n", d.Allowed, d.Remaining,
			d.RetryAfter.Round(time.Second), d.Source)
	}
	// The first two requests for a new key are admitted locally from its cold-start credit; the third
	// asks Redis, which charges the first two and grants the third; Redis's answer said the bucket is
	// empty, so the fourth is denied locally, without a Redis command, until the refill covers it.

	// Output:
	// allowed=true remaining=2 retry-after=0s source=local
	// allowed=true remaining=1 retry-after=0s source=local
	// allowed=true remaining=0 retry-after=0s source=central
	// allowed=false remaining=0 retry-after=1s source=local
}

func ExampleLimiter_DecideN() {
	lim, stop := readyLimiter()
	defer stop()
	ctx := context.Background()

	// Weighted cost: an export costs 10 tokens of a 100-per-minute budget. A new key's first tokens
	// come from its cold-start credit (drift·Burst = 10 tokens), without waiting for Redis.
	d, _ := lim.DecideN(ctx, "tenant:7:export", hybrid.PerMinute(100), 10)
	fmt.Println(d.Allowed, d.Remaining, d.Source)
	// Output: true 90 local
}

func ExampleLimiter_AllowN() {
	lim, stop := readyLimiter()
	defer stop()
	ctx := context.Background()

	// Yes or no, as x/time/rate's AllowN answers: DecideN decides the same way and says more.
	ok, err := lim.AllowN(ctx, "tenant:7:export", hybrid.PerMinute(100), 10)
	fmt.Println(ok, err)
	_, err = lim.AllowN(ctx, "tenant:7:export", hybrid.PerMinute(100), 101) // more than the burst
	fmt.Println(errors.Is(err, hybrid.ErrInvalidCost))
	// Output:
	// true <nil>
	// true
}

// readyLimiter is exampleLimiter(pinnedTime) once the limiter is Ready (see Example): a new key's
// first tokens then come from its cold-start credit.
func readyLimiter() (lim *hybrid.Limiter, stop func()) {
	lim, stop = exampleLimiter(pinnedTime)
	for !lim.Ready() {
		time.Sleep(time.Millisecond)
	}
	return lim, stop
}

// redisTime says whether an example's Redis TIME runs or stands still.
type redisTime int

const (
	pinnedTime  redisTime = iota // buckets do not refill while the example runs: stable output
	runningTime                  // buckets refill: for examples that wait
)

// exampleLimiter starts a miniredis and a limiter over it for an example; stop releases both.
func exampleLimiter(clock redisTime) (lim *hybrid.Limiter, stop func()) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	if clock == pinnedTime {
		m.SetTime(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	lim, err := hybrid.New(rdb, hybrid.WithCheckTimeout(time.Second)) // miniredis's Lua is slow
	if err != nil {
		panic(err)
	}
	return lim, func() {
		_ = lim.Close(context.Background())
		_ = rdb.Close()
		m.Close()
	}
}

func ExampleLimiter_Wait() {
	lim, stop := exampleLimiter(runningTime)
	defer stop()
	ctx := context.Background()

	// A background job that may start 100 runs per second, one at a time: Wait blocks until a run
	// is admitted, sleeping the decision's RetryAfter between attempts.
	limit := hybrid.Limit{Rate: 100, Burst: 1}
	for i := 0; i < 3; i++ {
		if err := lim.Wait(ctx, "jobs:reindex", limit); err != nil {
			panic(err)
		}
		fmt.Println("run", i)
	}

	// A deadline that the refill cannot meet fails at once, as with x/time/rate.
	hourly := hybrid.PerHour(1)
	_ = lim.Wait(ctx, "jobs:digest", hourly)
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := lim.Wait(dctx, "jobs:digest", hourly)
	fmt.Println(errors.Is(err, context.DeadlineExceeded), dctx.Err() == nil)
	// Output:
	// run 0
	// run 1
	// run 2
	// true true
}

func ExampleReservation_Cancel() {
	lim, stop := exampleLimiter(pinnedTime)
	defer stop()
	ctx := context.Background()

	// A hierarchy: a request must pass its user's limit and its tenant's. When the tenant's limit
	// denies it, the tokens the user's limit took go back.
	user, tenant := hybrid.PerMinute(5), hybrid.PerMinute(1)
	for i := 0; i < 2; i++ {
		r, err := lim.Reserve(ctx, "user:42", user)
		if err != nil || !r.OK() {
			fmt.Println("denied by the user's limit")
			continue
		}
		ok, err := lim.Allow(ctx, "tenant:7", tenant)
		if err != nil || !ok {
			fmt.Println("denied by the tenant's limit; user tokens given back:", r.Cancel())
			continue
		}
		fmt.Println("admitted")
	}
	// Output:
	// admitted
	// denied by the tenant's limit; user tokens given back: 1
}

func ExampleLimiter_Refund() {
	lim, stop := exampleLimiter(pinnedTime)
	defer stop()
	ctx := context.Background()

	// An upload reserves its worst-case cost, then gives back what it did not use.
	limit := hybrid.PerHour(10)
	d, _ := lim.DecideN(ctx, "upload:alice", limit, 10)
	fmt.Println(d.Allowed, d.Remaining)
	got, _ := lim.Refund(ctx, "upload:alice", limit, 4)
	fmt.Println("refunded", got)
	d, _ = lim.DecideN(ctx, "upload:alice", limit, 4) // answered from the refunded tokens
	fmt.Println(d.Allowed, d.Remaining, d.Source)
	// Output:
	// true 0
	// refunded 4
	// true 0 local
}

func ExampleLimiter_Peek() {
	lim, stop := exampleLimiter(pinnedTime)
	defer stop()
	ctx := context.Background()

	limit := hybrid.PerHour(100)
	d, _ := lim.Peek(ctx, "report:9", limit) // unknown here: Peek reads Redis
	fmt.Println(d.Allowed, d.Remaining, d.Source)
	_, _ = lim.AllowN(ctx, "report:9", limit, 30)
	d, _ = lim.Peek(ctx, "report:9", limit) // from this node's lease and Redis's last answer
	fmt.Println(d.Allowed, d.Remaining, d.Source)
	// Output:
	// true 100 central
	// true 70 local
}
