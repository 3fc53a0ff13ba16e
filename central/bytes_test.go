package central

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/internal/strictbucket"
)

// BenchmarkBucketBytes reports what a real redis-server holds per bucket (metric B/key: MEMORY
// USAGE SAMPLES 0 of the key, name included, averaged over 1,000 keys named as bench's
// BenchmarkRedisBytesPerBucket names them, prefixes of one length). Rows:
//   - impl=central-bucket: the strict central Lua token bucket (internal/strictbucket) after one take;
//   - impl=v6/nodes=N: this package's bucket after N nodes (node ids of 16 hex digits, as hybrid's
//     random ones) each made one Take;
//   - impl=shape/…: hashes written with HSET, of the field names and value lengths given in the
//     row's name (b37 = field "b" with a 37-byte value; n9v32 = a 9-byte field name with a
//     32-byte value): the current layout's shape, to check that the shapes measure what the scripts
//     write, and candidate layouts, to tell what a layout must fit in to meet a size.
//
// Run it with -benchtime 1x (docs/benchmarks.md, issue 24's fifth pass):
//
//	go test ./central -run '^$' -bench BucketBytes -benchtime 1x
func BenchmarkBucketBytes(b *testing.B) {
	rdb := redistest.Start(b).Client(b)
	ctx := context.Background()
	const n = 1000
	usage := func(b *testing.B, keys []string) float64 { return redistest.MeanMemoryUsage(b, ctx, rdb, keys) }
	report := func(b *testing.B, keys []string) {
		b.ReportMetric(usage(b, keys), "B/key")
		b.ReportMetric(0, "ns/op")
	}
	b.Run("impl=central-bucket", func(b *testing.B) {
		script := redis.NewScript(strictbucket.Source())
		for i := 0; i < b.N; i++ {
			keys := make([]string, n)
			for j := range keys {
				keys[j] = "bench" + strconv.Itoa(i) + ":lua:{user:" + strconv.Itoa(j) + "}"
				if err := script.Run(ctx, rdb, keys[j:j+1], "100", 100, 1).Err(); err != nil {
					b.Fatal(err)
				}
			}
			report(b, keys)
		}
	})
	for _, nodes := range []int{1, 2, 8} {
		b.Run("impl=v6/nodes="+strconv.Itoa(nodes), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				prefix := "bytes" + strconv.Itoa(nodes) + "x" + strconv.Itoa(i)
				for k := range nodes {
					cfg := testConfig(rdb, strings.Repeat(strconv.Itoa(k%10), 16))
					cfg.Prefix = prefix
					c, err := New(cfg)
					if err != nil {
						b.Fatal(err)
					}
					for j := range n {
						_, err := c.Take(ctx, Update{Key: "user:" + strconv.Itoa(j), Limit: Limit{Rate: 100, Burst: 100},
							Inc: 1, Demand: 1, Want: 1, N: 1})
						if err != nil {
							b.Fatal(err)
						}
					}
				}
				keys := make([]string, n)
				for j := range keys {
					keys[j] = BucketKey(prefix, "user:"+strconv.Itoa(j))
				}
				report(b, keys)
			}
		})
	}
	// A key only one-off takes touched (take.lua: the bucket and its one-off demand, no node record).
	b.Run("impl=v6/one-off", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			prefix := "bytesoneoff" + strconv.Itoa(i)
			cfg := testConfig(rdb, "node")
			cfg.Prefix = prefix
			c, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			keys := make([]string, n)
			for j := range n {
				if _, err := c.Take(ctx, Update{Key: "user:" + strconv.Itoa(j), Limit: Limit{Rate: 100, Burst: 100},
					Want: 1, N: 1}); err != nil {
					b.Fatal(err)
				}
				keys[j] = BucketKey(prefix, "user:"+strconv.Itoa(j))
			}
			report(b, keys)
		}
	})
	shapes := []string{
		"b37+n9v32",         // v6, one node: the bucket and a node record (a packed 16-digit id)
		"b37+n9v32+n9v32",   // v6, two nodes
		"b37",               // v6's bucket alone
		"b37+n18v32",        // v6 with a 16-character id in the field name
		"b48+n18v40",        // v5, one node
		"b48+n18v40+n18v40", // v5, two nodes
		"b32+n3v24",         // narrower numbers, node numbers
		"b36",               // one field for the bucket and its one node's record
		"b20",
	}
	for s, shape := range shapes {
		b.Run("impl=shape/"+shape, func(b *testing.B) {
			var fields []any
			for k, f := range strings.Split(shape, "+") {
				name, value := "b", f[1:]
				if f[0] == 'n' {
					nl, vl, _ := strings.Cut(f[1:], "v")
					l, _ := strconv.Atoi(nl)
					name, value = "n:"+strings.Repeat(strconv.Itoa(k%10), l-2), vl
				}
				l, _ := strconv.Atoi(value)
				fields = append(fields, name, strings.Repeat("\x01", l))
			}
			for i := 0; i < b.N; i++ {
				keys := make([]string, n)
				pipe := rdb.Pipeline()
				for j := range keys {
					keys[j] = BucketKey("bytes"+string(rune('a'+s))+"x"+strconv.Itoa(i), "user:"+strconv.Itoa(j))
					pipe.HSet(ctx, keys[j], fields...)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
				report(b, keys)
			}
		})
	}
}
