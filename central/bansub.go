package central

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The ban channel's subscription: how long silence lasts before a PING, and the reconnection backoff.
// A PING wakes Redis up: on an otherwise quiet server (hybrid keys holding leases) each costs
// about as much Redis CPU as a reconcile call (the hot scenario spent ~8% of its Redis CPU on
// one-second PINGs). A closed or reset connection fails at once without one; a silent one is
// found within two health checks, and the ban change log is read every banRefresh (10 s) anyway.
const (
	subHealthCheck = 10 * time.Second
	subBackoffMin  = 100 * time.Millisecond
	subBackoffMax  = time.Second
)

// banSubscription holds the ban channel's Pub/Sub connection for WatchBans. Unlike go-redis's
// PubSub.Channel, which redials every 100ms while Redis refuses it (a wrong password, a dead server:
// each attempt a connection and a line in go-redis's log), it backs off up to a second between
// attempts.
type banSubscription struct {
	rdb     redis.UniversalClient // bounded (redisx.Bound): its dials and handshakes end on a hung server
	timeout time.Duration         // bounds a subscription's set-up (dial, handshake, SUBSCRIBE)
	channel string
	out     chan any // *redis.Subscription and *redis.Message

	mu     sync.Mutex    // guards ps and closed
	ps     *redis.PubSub // the current subscription
	closed bool
	done   chan struct{} // closed when run returns
}

func newBanSubscription(rdb redis.UniversalClient, channel string, timeout time.Duration) *banSubscription {
	return &banSubscription{rdb: rdb, timeout: timeout, channel: channel, out: make(chan any, 256), done: make(chan struct{})}
}

// run subscribes, delivers messages to out and resubscribes after failures, until close.
func (s *banSubscription) run(ctx context.Context) {
	defer close(s.done)
	backoff := time.Duration(0)
	for {
		if backoff > 0 {
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		ps := s.rdb.Subscribe(ctx) // no channel yet: no I/O
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = ps.Close()
			return
		}
		s.ps = ps
		s.mu.Unlock()
		got, err := s.receive(ctx, ps)
		_ = ps.Close()
		if ctx.Err() != nil || errors.Is(err, redis.ErrClosed) {
			return
		}
		if got {
			backoff = subBackoffMin
		} else {
			backoff = min(max(2*backoff, subBackoffMin), subBackoffMax)
		}
	}
}

// receive subscribes ps and forwards its messages until a failure; got reports whether anything
// was received.
func (s *banSubscription) receive(ctx context.Context, ps *redis.PubSub) (got bool, err error) {
	// The set-up has a deadline: close cannot interrupt a connection that is still being made (ps has
	// none yet), and on a hung server its handshake would otherwise wait for the client's ReadTimeout,
	// holding up Close (issue 26: 4.7s in policy's TestHungClusterBounded).
	sctx, cancel := context.WithTimeout(ctx, s.timeout)
	err = ps.Subscribe(sctx, s.channel)
	cancel()
	if err != nil {
		return false, err
	}
	pinged := false
	for {
		m, err := ps.ReceiveTimeout(ctx, subHealthCheck)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged && ctx.Err() == nil {
				// Silence: ask for a PONG; a second silence means the connection is dead.
				if err := ps.Ping(ctx); err != nil {
					return got, err
				}
				pinged = true
				continue
			}
			return got, err
		}
		got, pinged = true, false
		switch m.(type) {
		case *redis.Subscription, *redis.Message:
			select {
			case s.out <- m:
			case <-ctx.Done():
				return got, ctx.Err()
			}
		}
	}
}

// close ends run (it interrupts a blocked read by closing the connection) and waits for it.
func (s *banSubscription) close() {
	s.mu.Lock()
	s.closed = true
	if s.ps != nil {
		_ = s.ps.Close()
	}
	s.mu.Unlock()
	<-s.done
}
