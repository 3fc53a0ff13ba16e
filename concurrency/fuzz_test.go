package concurrency_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/lua"
)

// FuzzScript sends concurrency.lua arbitrary arguments on a real Redis: it answers either
// "ERR hybridrate: bad …" (and changes nothing) or a well-formed reply, never another error, and
// never lets a key hold more leases than the largest limit it was given.
func FuzzScript(f *testing.F) {
	srv := redistest.Start(f)
	rdb := srv.Client(f)
	script := redis.NewScript(lua.Concurrency())
	for _, seed := range [][4]string{
		{"a", "id", "1", "1000"}, {"a", "id2", "1", "1000"}, {"r", "id", "", ""}, {"e", "id", "", "5"},
		{"n", "", "", ""}, {"a", "", "1", "1000"}, {"a", strings.Repeat("x", 65), "1", "1000"},
		{"a", "id", "0", "1000"}, {"a", "id", "1048577", "1000"}, {"a", "id", "-1", "1000"},
		{"a", "id", "1e3", "1000"}, {"a", "id", "0x10", "1000"}, {"a", "id", " 5", "1000"},
		{"a", "id", "5", "86400001"}, {"a", "id", "5", "nan"}, {"a", "id", "5", "inf"},
		{"x", "id", "5", "100"}, {"", "", "", ""}, {"a", "id", "99999999999", "1"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	f.Fuzz(func(t *testing.T, op, id, limit, ttl string) {
		ctx := context.Background()
		const key = "hr:v1:c:{fuzz}"
		before, err := rdb.ZCard(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		res, err := script.Run(ctx, rdb, []string{key}, op, id, limit, ttl).Result()
		after, err2 := rdb.ZCard(ctx, key).Result()
		if err2 != nil {
			t.Fatal(err2)
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "ERR hybridrate: bad ") {
				t.Fatalf("(%q, %q, %q, %q): error %v", op, id, limit, ttl, err)
			}
			if after > before {
				t.Fatalf("(%q, %q, %q, %q): a refused call added leases: %d -> %d", op, id, limit, ttl, before, after)
			}
			return
		}
		a, ok := res.([]any)
		if !ok || len(a) != 3 {
			t.Fatalf("(%q, %q, %q, %q): reply %#v", op, id, limit, ttl, res)
		}
		for i, v := range a {
			if n, ok := v.(int64); !ok || n < 0 {
				t.Fatalf("(%q, %q, %q, %q): reply element %d is %#v", op, id, limit, ttl, i, v)
			}
		}
		if a[1].(int64) != after {
			t.Fatalf("(%q, %q, %q, %q): in_flight %d, the set holds %d", op, id, limit, ttl, a[1], after)
		}
		if after > 1<<20 {
			t.Fatalf("(%q, %q, %q, %q): %d leases, more than any limit", op, id, limit, ttl, after)
		}
	})
}
