package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStartTLS(t *testing.T) {
	t.Parallel()
	s := StartTLS(t, "--requirepass", "secret")
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Fatalf("PING over TLS = %#v, want PONG", got)
	}
	ctx := context.Background()

	t.Run("go-redis connects with rediss:// and the test CA", func(t *testing.T) {
		opt, err := redis.ParseURL("rediss://:secret@" + s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		opt.TLSConfig = s.ClientTLSConfig()
		rdb := redis.NewClient(opt)
		t.Cleanup(func() { _ = rdb.Close() })
		if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatalf("SET over TLS: %v", err)
		}
		if got, err := rdb.Get(ctx, "k").Result(); err != nil || got != "v" {
			t.Fatalf("GET over TLS = %q, %v", got, err)
		}
	})

	t.Run("a client without the CA is refused", func(t *testing.T) {
		opt, err := redis.ParseURL("rediss://:secret@" + s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		opt.MaxRetries = -1
		rdb := redis.NewClient(opt) // system roots only
		t.Cleanup(func() { _ = rdb.Close() })
		if err := rdb.Ping(ctx).Err(); err == nil {
			t.Fatal("PING with an untrusted certificate succeeded")
		}
	})

	t.Run("plain text is not served", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr, Password: "secret", MaxRetries: -1,
			DialTimeout: time.Second, ReadTimeout: time.Second})
		t.Cleanup(func() { _ = rdb.Close() })
		if err := rdb.Ping(ctx).Err(); err == nil {
			t.Fatal("PING in plain text on the TLS port succeeded")
		}
	})
}
