package relay_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/relay"
)

// The cost of a child's synchronous call answered from the relay's pool (a key with room: the
// pool rarely needs Redis), in process and over loopback HTTP, beside the same call to Redis
// (central.Client.Take, a one-off take: take.lua). docs/benchmarks.md has the figures.
func BenchmarkTake(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	big := central.Limit{Rate: 1e6, Burst: 1e6}
	u := central.Update{Key: "k", Limit: big, N: 1}
	ctx := context.Background()
	b.Run("relay=in-process", func(b *testing.B) {
		r := newRelay(b, rdb, "rb1", "relay")
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Take(ctx, "n", u); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("relay=http", func(b *testing.B) {
		r := newRelay(b, rdb, "rb2", "relay")
		hs := httptest.NewServer(r.Handler())
		defer hs.Close()
		m := relay.Dial(hs.URL, hs.Client())
		b.ReportAllocs()
		for b.Loop() {
			if _, err := m.Take(ctx, "n", u); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("redis=take.lua", func(b *testing.B) {
		c, err := central.New(relay.ClientConfig(rdb, "rb3", "node"))
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Take(ctx, u); err != nil {
				b.Fatal(err)
			}
		}
	})
}
