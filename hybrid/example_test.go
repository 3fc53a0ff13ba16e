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
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	m.SetTime(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	lim, err := hybrid.New(rdb, hybrid.WithCheckTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	defer lim.Close(ctx)
	for !lim.Ready() { // see Example
		time.Sleep(time.Millisecond)
	}

	// Weighted cost: an export costs 10 tokens of a 100-per-minute budget. A new key's first tokens
	// come from its cold-start credit (drift·Burst = 10 tokens), without waiting for Redis.
	d, _ := lim.DecideN(ctx, "tenant:7:export", hybrid.PerMinute(100), 10)
	fmt.Println(d.Allowed, d.Remaining, d.Source)
	// Output: true 90 local
}

func ExampleLimiter_AllowN() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	m.SetTime(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	lim, err := hybrid.New(rdb, hybrid.WithCheckTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	defer lim.Close(ctx)
	for !lim.Ready() { // see Example
		time.Sleep(time.Millisecond)
	}

	// Yes or no, as x/time/rate's AllowN answers: DecideN decides the same way and says more.
	ok, err := lim.AllowN(ctx, "tenant:7:export", hybrid.PerMinute(100), 10)
	fmt.Println(ok, err)
	_, err = lim.AllowN(ctx, "tenant:7:export", hybrid.PerMinute(100), 101) // more than the burst
	fmt.Println(errors.Is(err, hybrid.ErrInvalidCost))
	// Output:
	// true <nil>
	// true
}
