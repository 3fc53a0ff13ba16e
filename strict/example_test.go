package strict_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/strict"
)

func Example() {
	m, err := miniredis.Run() // or any Redis: a *redis.Client, a Cluster or a Sentinel client
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	l, err := strict.New(rdb, strict.WithTimeout(time.Second)) // only the client is required
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	// Two logins an hour: the bucket refills one token per 30 minutes, so the third try is denied.
	login := strict.Rule{Name: "login", Algorithm: strict.TokenBucket, Limit: 2, Period: time.Hour}
	for range 3 {
		res, err := l.Decide(ctx, login, "alice")
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry in about %v\n", res.Allowed, res.Remaining, res.RetryAfter.Round(time.Minute))
	}

	// Allow answers yes or no; an invalid request is refused before anything is sent.
	ok, err := l.Allow(ctx, login, "alice")
	fmt.Println(ok, err)
	_, err = l.AllowN(ctx, login, "alice", 3)
	fmt.Println(errors.Is(err, strict.ErrInvalid), strict.IsTransport(err))
	fmt.Println(err)
	// Output:
	// allowed=true remaining=1 retry in about 0s
	// allowed=true remaining=0 retry in about 0s
	// allowed=false remaining=0 retry in about 30m0s
	// false <nil>
	// true false
	// strict: invalid request: rule "login": n=3 out of range [1, limit=2]
}

func ExampleRule_Validate() {
	for _, r := range []strict.Rule{
		{Name: "api", Algorithm: strict.GCRA, Limit: 100, Period: time.Second},
		{Name: "api", Algorithm: strict.FixedWindow, Limit: 0, Period: time.Minute},
		{Name: "api", Algorithm: strict.SlidingWindow, Limit: 10, Period: time.Microsecond},
		{Name: "no spaces", Algorithm: strict.SlidingLog, Limit: 10, Period: time.Minute},
	} {
		fmt.Println(r.Validate())
	}
	// Output:
	// <nil>
	// strict: invalid request: rule "api": limit 0: want 1 to 1000000000
	// strict: invalid request: rule "api": period 1µs: want 1ms to 27777h46m40s
	// strict: invalid request: rule name "no spaces": want 1 to 64 bytes of [A-Za-z0-9_.-]
}
