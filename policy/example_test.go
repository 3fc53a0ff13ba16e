package policy_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/policy"
)

// This example parses a policy file and checks requests against it. A fleet-wide hybrid rule admits
// everything here; an exact per-key rule admits two exports an hour. The Redis is miniredis with its
// clock stopped, so the output does not depend on the time it runs.
func Example() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	now := time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC)
	mr.SetTime(now) // Redis TIME: what strict rules count with
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	defer rdb.Close()

	p, err := policy.Parse([]byte(`
version: 1
rules:
  - id: global
    rate: 5000/s
    burst: 10000
    on_failure: fail_open
  - id: exports
    algorithm: gcra
    dimensions: [api_key]
    match: {methods: [POST]}
    limit: 2
    period: 1h
    on_failure: fail_closed
`), "policy.yaml")
	if err != nil {
		log.Fatal(err)
	}
	enf, err := policy.NewEnforcer(
		rdb,
		policy.WithStrictTimeout(time.Second),
		policy.WithHybridOptions(hybrid.WithCheckTimeout(time.Second)),
		policy.WithClock(func() time.Time { return now }),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer enf.Close(context.Background())
	if err := enf.SetPolicy(p); err != nil {
		log.Fatal(err)
	}

	for i := 1; i <= 4; i++ {
		res, err := enf.Check(context.Background(), &policy.Request{Method: "POST", Dims: policy.Values{"api_key": "k1"}})
		if err != nil {
			log.Fatal(err)
		}
		if res.Allowed {
			fmt.Printf("export %d: allowed\n", i)
			continue
		}
		last := res.Decisions[len(res.Decisions)-1]
		fmt.Printf("export %d: denied by %s, retry after %v (%v)\n", i, res.Rule, res.RetryAfter, last.Source)
	}
	// Output:
	// export 1: allowed
	// export 2: allowed
	// export 3: denied by exports, retry after 30m0s (strict)
	// export 4: denied by exports, retry after 30m0s (memo)
}
