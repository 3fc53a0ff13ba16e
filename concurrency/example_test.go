package concurrency_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/concurrency"
)

// At most two jobs of one tenant run at once; a third waits for a slot or is turned away.
func Example() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	lim, err := concurrency.New(rdb)
	if err != nil {
		panic(err)
	}
	defer lim.Close(ctx)

	a, _ := lim.TryAcquire(ctx, "tenant-x", 2, time.Minute)
	b, _ := lim.TryAcquire(ctx, "tenant-x", 2, time.Minute)
	c, _ := lim.TryAcquire(ctx, "tenant-x", 2, time.Minute)
	fmt.Println(a.Acquired(), b.Acquired(), c.Acquired(), c.InFlight(), c.Source())

	_ = a.Release(ctx)
	_ = a.Release(ctx) // a second Release does nothing
	d, _ := lim.TryAcquire(ctx, "tenant-x", 2, time.Minute)
	fmt.Println(d.Acquired(), d.InFlight())
	// Output:
	// true true false 2 central
	// true 2
}
