package redistest

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// ports records the ports this process has handed out and not yet released,
// so that two servers of one test binary never race for the same port, and
// a killed server's port is not given to another server before its Restart.
var ports struct {
	mu    sync.Mutex
	taken map[int]bool
}

// pickPort returns a loopback TCP port that nothing listens on.
//
// It prefers ports just below the kernel's ephemeral range: the kernel never
// hands those out as the local port of an outgoing connection, so a port
// freed by Kill stays free for Restart. It checks each candidate by
// listening on it; another process can still take the port before
// redis-server binds it, which the callers handle by retrying.
func pickPort() (int, error) {
	lo, hi := candidateRange()
	ports.mu.Lock()
	defer ports.mu.Unlock()
	if ports.taken == nil {
		ports.taken = make(map[int]bool)
	}
	for range 200 {
		var port int
		if lo == 0 {
			port = kernelPort()
		} else {
			port = lo + rand.IntN(hi-lo)
		}
		if port == 0 || ports.taken[port] || !canListen(port) {
			continue
		}
		ports.taken[port] = true
		return port, nil
	}
	return 0, errors.New("redistest: no free loopback port found")
}

// releasePort makes port available to pickPort again.
func releasePort(port int) {
	if port == 0 {
		return
	}
	ports.mu.Lock()
	defer ports.mu.Unlock()
	delete(ports.taken, port)
}

// candidateRange returns the 10,000 ports below the ephemeral range, or
// 0, 0 to let the kernel choose.
func candidateRange() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 20000, 30000 // below the ephemeral ranges of macOS and the BSDs
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, 0
	}
	first, err := strconv.Atoi(f[0])
	if err != nil || first < 11024 {
		return 0, 0
	}
	return first - 10000, first
}

func canListen(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func kernelPort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
