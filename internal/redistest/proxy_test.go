package redistest

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startEcho starts a TCP echo server on a loopback port and stops it, with
// its goroutines, in tb.Cleanup.
func startEcho(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// dial connects to addr and closes the connection in tb.Cleanup.
func dial(tb testing.TB, addr string) net.Conn {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// echo writes msg to c and reads it back within timeout.
func echo(c net.Conn, msg string, timeout time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo mismatch: " + string(buf))
	}
	return nil
}

func TestProxyForwards(t *testing.T) {
	t.Parallel()
	p := NewProxy(t, startEcho(t))
	c := dial(t, p.Addr)
	for _, msg := range []string{"hello", "world"} {
		if err := echo(c, msg, time.Second); err != nil {
			t.Fatalf("echo %q: %v", msg, err)
		}
	}
}

func TestProxyLatencyDelaysReplies(t *testing.T) {
	t.Parallel()
	const latency = 150 * time.Millisecond
	p := NewProxy(t, startEcho(t))
	c := dial(t, p.Addr)

	p.SetLatency(latency)
	start := time.Now()
	if err := echo(c, "slow", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := time.Since(start); got < latency {
		t.Errorf("round trip with latency %v took %v", latency, got)
	}

	p.SetLatency(0)
	start = time.Now()
	if err := echo(c, "fast", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := time.Since(start); got >= latency {
		t.Errorf("round trip without latency took %v", got)
	}
}

func TestProxyCutClosesConnectionsUntilRestore(t *testing.T) {
	t.Parallel()
	p := NewProxy(t, startEcho(t))
	old := dial(t, p.Addr)
	if err := echo(old, "before", time.Second); err != nil {
		t.Fatal(err)
	}

	p.Cut()
	if err := echo(old, "after", time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("echo on a cut connection: err = %v, want a closed connection", err)
	}
	if err := echo(dial(t, p.Addr), "new", time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("echo on a new connection while cut: err = %v, want a closed connection", err)
	}

	p.Restore()
	if err := echo(dial(t, p.Addr), "restored", time.Second); err != nil {
		t.Errorf("echo after Restore: %v", err)
	}
}

func TestProxyBlackholeHoldsDataUntilLifted(t *testing.T) {
	t.Parallel()
	p := NewProxy(t, startEcho(t))
	c := dial(t, p.Addr)
	if err := echo(c, "before", time.Second); err != nil {
		t.Fatal(err)
	}

	p.Blackhole(true)
	if err := echo(c, "held", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("echo while blackholed: err = %v, want a timeout", err)
	}
	fresh := dial(t, p.Addr) // accepted, but silent too
	if err := echo(fresh, "fresh", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("echo on a new connection while blackholed: err = %v, want a timeout", err)
	}

	p.Blackhole(false)
	// The held bytes arrive first, in order.
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len("held"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after the blackhole: read %q, %v; want %q", buf, err, "held")
	}
	if err := echo(c, "after", 5*time.Second); err != nil {
		t.Errorf("echo after the blackhole: %v", err)
	}
}

func TestProxyFaultsReachAGoRedisClient(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := NewProxy(t, s.Addr)
	ctx := context.Background()
	rdb := s.Client(t, func(o *redis.Options) {
		o.Addr = p.Addr
		o.ReadTimeout = 200 * time.Millisecond
		o.DialTimeout = 200 * time.Millisecond
		o.MaxRetries = -1
	})
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	t.Run("a blackhole makes a command time out", func(t *testing.T) {
		p.Blackhole(true)
		var netErr net.Error
		if err := rdb.Ping(ctx).Err(); !errors.As(err, &netErr) || !netErr.Timeout() {
			t.Errorf("PING while blackholed: err = %v, want a timeout", err)
		}
		p.Blackhole(false)
		eventually(t, 5*time.Second, func() error { return rdb.Ping(ctx).Err() })
	})

	t.Run("a cut fails commands fast", func(t *testing.T) {
		p.Cut()
		err := rdb.Ping(ctx).Err()
		var netErr net.Error
		if err == nil || (errors.As(err, &netErr) && netErr.Timeout()) {
			t.Errorf("PING while cut: err = %v, want a connection error", err)
		}
		p.Restore()
		eventually(t, 5*time.Second, func() error { return rdb.Ping(ctx).Err() })
	})

	t.Run("latency slows every reply", func(t *testing.T) {
		p.SetLatency(50 * time.Millisecond)
		defer p.SetLatency(0)
		start := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got < 50*time.Millisecond {
			t.Errorf("PING with 50ms latency took %v", got)
		}
	})
}
