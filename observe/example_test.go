package observe_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/observe"
	"github.com/hybridrate/hybridrate/policy"
)

// An Observer wraps an Enforcer: every check is counted by rule, route and tier, and denials reach
// OnDeny with a hashed key.
func Example() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	enf, err := policy.NewEnforcer(
		rdb,
		policy.WithHybridOptions(hybrid.WithCheckTimeout(time.Second)),
	) // miniredis's Lua is slow
	if err != nil {
		panic(err)
	}
	defer enf.Close(context.Background())

	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) // a fixed clock for the window
	obs, err := observe.New(enf,
		observe.WithClock(func() time.Time { return now }),
		observe.WithOnDeny(func(ev *observe.Event) { fmt.Printf("denied by %s on %s\n", ev.Result.Rule, ev.Route) }),
	)
	if err != nil {
		panic(err)
	}
	defer obs.Close()
	if err := obs.SetPolicy(&policy.Policy{Rules: []policy.Rule{
		{ID: "per-key", Dimensions: []string{"api_key"}, Limit: 3, Period: time.Minute},
	}}); err != nil {
		panic(err)
	}
	for i := 0; i < 4; i++ {
		_, _ = obs.Check(context.Background(), &policy.Request{Method: "GET",
			Dims: policy.Values{"api_key": "k1", "route": "GET /v1/items/{id}"}})
	}
	s := obs.Snapshot(time.Minute)
	fmt.Printf("in the last minute: %d admitted, %d denied\n", s.Sum.Allowed, s.Sum.Denied)
	for _, d := range s.Denied {
		fmt.Printf("%s %s: %d\n", d.Route, d.Rule, d.N)
	}
	// Output:
	// denied by per-key on GET /v1/items/{id}
	// in the last minute: 3 admitted, 1 denied
	// GET /v1/items/{id} per-key: 1
}
