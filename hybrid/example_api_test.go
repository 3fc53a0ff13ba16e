package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
)

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
