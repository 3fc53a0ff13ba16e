package redistest

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// proxyBufSize is the size of the chunks a Proxy reads and forwards.
const proxyBufSize = 32 << 10

// Proxy is an in-process TCP proxy that forwards every connection made to
// Addr to a target address, for injecting network faults between a client
// and a server: latency ([Proxy.SetLatency]), dropped connections
// ([Proxy.Cut]) and a silent network ([Proxy.Blackhole]).
//
// A new Proxy forwards without faults. It is safe for concurrent use, and
// is closed, with all its connections, in the cleanup of the test that
// created it.
type Proxy struct {
	// Addr is the address clients connect to, "127.0.0.1:PORT".
	Addr string

	target  string
	ln      net.Listener
	ctx     context.Context // cancelled by close; bounds dials to target
	cancel  context.CancelFunc
	latency atomic.Int64 // time.Duration added to each chunk sent to the client

	mu     sync.Mutex // guards the fields below
	conns  map[*proxyConn]struct{}
	cut    bool          // refuse connections until Restore
	hold   chan struct{} // non-nil while blackholed; closed when the blackhole ends
	closed bool

	wg sync.WaitGroup // the accept loop and every connection's goroutines
}

// proxyConn is one proxied connection: the client's and the server's side.
type proxyConn struct {
	client, server net.Conn
	done           chan struct{} // closed by close
	once           sync.Once
}

func (pc *proxyConn) close() {
	pc.once.Do(func() {
		close(pc.done)
		pc.client.Close()
		pc.server.Close()
	})
}

// NewProxy starts a proxy on a free loopback port that forwards to target
// (host:port), and registers its cleanup.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: proxy listen: %v", err)
	}
	p := &Proxy{
		Addr:   ln.Addr().String(),
		target: target,
		ln:     ln,
		conns:  make(map[*proxyConn]struct{}),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.acceptLoop()
	tb.Cleanup(p.close)
	return p
}

// Client returns a go-redis client that connects through the proxy, with Addr preset before opt
// are applied. The client is closed in tb.Cleanup, before the proxy (registered earlier) is.
func (p *Proxy) Client(tb testing.TB, opt ...func(*redis.Options)) *redis.Client {
	tb.Helper()
	return newClient(tb, &redis.Options{Addr: p.Addr}, opt)
}

// SetLatency delays each chunk of data the proxy reads from the server by d
// before writing it to the client; zero, the initial value, adds nothing.
// Chunks are delayed one after another, so a long reply read in several
// chunks is delayed several times.
func (p *Proxy) SetLatency(d time.Duration) {
	p.latency.Store(int64(d))
}

// Cut closes every current connection and, until [Proxy.Restore], closes
// each new one right after accepting it, so clients see a reset or EOF
// rather than a timeout.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = make(map[*proxyConn]struct{})
	p.mu.Unlock()
	for pc := range conns {
		pc.close()
	}
}

// Restore ends a [Proxy.Cut]: new connections are forwarded again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Blackhole, when on is true, stops forwarding data in both directions
// while keeping every connection open; new connections are accepted but get
// no data either. A client's reads hang until its timeout, as when the
// network goes silent between a request and its reply.
//
// When on is false, the proxy forwards again, including the data held
// meanwhile, in order, as TCP would after a partition heals: a request the
// client has given up on can still reach the server then.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.hold == nil:
		p.hold = make(chan struct{})
	case !on && p.hold != nil:
		close(p.hold)
		p.hold = nil
	}
}

// close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.cancel()
	p.ln.Close()
	for pc := range conns {
		pc.close()
	}
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // for example EMFILE; back off and keep serving
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		p.mu.Unlock()
		if refuse {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve dials the target for client and starts the two pumps.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	var d net.Dialer
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	server, err := d.DialContext(ctx, "tcp", p.target)
	cancel()
	if err != nil {
		client.Close()
		return
	}
	pc := &proxyConn{client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	if p.cut || p.closed {
		p.mu.Unlock()
		pc.close()
		return
	}
	p.conns[pc] = struct{}{}
	p.wg.Add(2)
	p.mu.Unlock()
	go p.pump(pc, client, server, false)
	go p.pump(pc, server, client, true)
}

// pump copies src to dst until either side fails, then closes the pair.
func (p *Proxy) pump(pc *proxyConn, src, dst net.Conn, toClient bool) {
	defer p.wg.Done()
	defer p.forget(pc)
	buf := make([]byte, proxyBufSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if toClient && !p.delay(pc) {
				return
			}
			if !p.waitForward(pc) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// delay sleeps for the current latency; it reports false if pc was closed.
func (p *Proxy) delay(pc *proxyConn) bool {
	d := time.Duration(p.latency.Load())
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-pc.done:
		return false
	}
}

// waitForward waits while the proxy is blackholed; it reports false if pc
// was closed.
func (p *Proxy) waitForward(pc *proxyConn) bool {
	for {
		p.mu.Lock()
		hold := p.hold
		p.mu.Unlock()
		if hold == nil {
			return true
		}
		select {
		case <-hold:
		case <-pc.done:
			return false
		}
	}
}

// forget closes pc and drops it from the set of live connections.
func (p *Proxy) forget(pc *proxyConn) {
	pc.close()
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}
