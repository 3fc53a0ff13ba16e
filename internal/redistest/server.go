package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// readyTimeout bounds the wait for a new process to answer.
	readyTimeout = 10 * time.Second
	// pollInterval is how often readiness and health are polled.
	pollInterval = 10 * time.Millisecond
	// exitTimeout bounds the wait for a killed process to be reaped.
	exitTimeout = 10 * time.Second
	// restartPortTimeout bounds the retries of Restart while its port is busy.
	restartPortTimeout = 5 * time.Second
	// startAttempts is how many fresh ports Start tries when one is taken.
	startAttempts = 10
	// logTailLines is how much of a server's log failure messages show.
	logTailLines = 30
)

// errAddrInUse reports that redis-server could not bind its port.
var errAddrInUse = errors.New("redistest: address already in use")

// Binary returns the path of redis-server, looked up in PATH.
//
// If redis-server is missing, Binary skips the test with a message saying how
// to install it, or, when the environment variable CI is "true", fails it.
func Binary(tb testing.TB) string {
	tb.Helper()
	return lookTool(tb, "redis-server", "redis-server")
}

// lookTool finds name in PATH, or skips (fails under CI=true) the test with a
// hint to install pkg.
func lookTool(tb testing.TB, name, pkg string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err == nil && !supported {
		err = errUnsupportedOS
	}
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("redistest: %s not usable: %v", name, err)
	}
	if errors.Is(err, errUnsupportedOS) {
		tb.Skipf("redistest: %v", err)
	}
	tb.Skipf("redistest: %s not found in PATH; install it (e.g. apt-get install %s) to run the real-Redis tests", name, pkg)
	return ""
}

var errUnsupportedOS = errors.New("redistest: real-Redis tests need a Unix system")

// Server is one redis-server process started by [Start], [StartCluster] or
// [StartSentinel], listening on 127.0.0.1. It is killed in the cleanup of the
// test that started it.
//
// Most callers want [Server.Client]. [Server.Kill], [Server.Restart],
// [Server.Pause] and [Server.Resume] inject failures; [Server.Do],
// [Server.CommandStats] and [Server.ResetStats] inspect the server without
// going through go-redis.
//
// The zero Server is not usable. A Server is safe for concurrent use, but
// its methods fail the test through tb, so call them from the test's
// goroutine.
type Server struct {
	// Addr is the address clients connect to, "127.0.0.1:PORT".
	Addr string
	// Port is the TCP port. It stays the same across Restart.
	Port int

	bin      string
	extra    []string // arguments given to Start, appended last
	conf     string   // config file, for sentinels only; enables --sentinel
	cluster  bool     // whether to pick a cluster bus port
	busPort  int      // cluster bus port; 0 unless cluster
	password string   // value of --requirepass in extra, if any
	dir      string
	logPath  string

	mu     sync.Mutex // guards proc and paused, and serializes Kill, Restart, Pause, Resume
	proc   *process   // nil when not running
	paused bool
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	pid  int
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // result of Wait; read only after done is closed
}

// Start starts a standalone redis-server on a free loopback port, with no
// persistence (--save "" --appendonly no), no delay before a replica's first
// sync (--repl-diskless-sync-delay 0), and its working directory and log in
// tb.TempDir(). Extra args are appended to the command line, so they can
// override these; for example "--requirepass", "secret" (the password is
// then used by the harness and preset in [Server.Client]).
//
// Start returns once the server answers (within 10s, polled every 10ms),
// and registers a cleanup that kills it. The readiness probe is INFO server
// rather than PING, so that it can check the answer comes from the process
// just started and not from another one on the same port; if the chosen port
// turns out to be taken, Start retries on another one.
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	s := newServer(tb, args)
	s.startFresh(tb)
	return s
}

// newServer prepares a Server and registers its cleanup; it starts nothing.
func newServer(tb testing.TB, args []string) *Server {
	tb.Helper()
	s := &Server{
		bin:   Binary(tb),
		extra: append([]string(nil), args...),
		dir:   tb.TempDir(), // removed after the cleanup below has killed the server
	}
	s.logPath = filepath.Join(s.dir, "redis.log")
	for i := 0; i+1 < len(args); i++ {
		if strings.EqualFold(args[i], "--requirepass") {
			s.password = args[i+1]
		}
	}
	tb.Cleanup(func() {
		s.mu.Lock()
		err := s.stopLocked()
		s.mu.Unlock()
		releasePort(s.Port)
		releasePort(s.busPort)
		if err != nil {
			tb.Errorf("redistest: cleanup of %s: %v", s.Addr, err)
		}
		if tb.Failed() && s.Port != 0 {
			tb.Logf("redistest: log of redis-server %s (%s):\n%s", s.Addr, s.dir, s.logTail(10))
		}
	})
	return s
}

// startFresh picks free ports and launches the server, retrying with other
// ports if the chosen one is taken by the time redis-server binds it.
func (s *Server) startFresh(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for range startAttempts {
		releasePort(s.Port)
		releasePort(s.busPort)
		s.Port, s.busPort = 0, 0
		if s.Port, err = pickPort(); err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		if s.cluster {
			if s.busPort, err = pickPort(); err != nil {
				tb.Fatalf("redistest: %v", err)
			}
		}
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
		if err = s.launchLocked(); !errors.Is(err, errAddrInUse) {
			break
		}
	}
	if err != nil {
		tb.Fatalf("redistest: start redis-server on %s: %v\nlog tail (%s):\n%s", s.Addr, err, s.logPath, s.logTail(logTailLines))
	}
}

// argv returns the redis-server arguments for the current ports.
func (s *Server) argv() []string {
	var a []string
	if s.conf != "" {
		a = append(a, s.conf, "--sentinel")
	}
	a = append(a,
		"--port", strconv.Itoa(s.Port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", s.logPath,
		"--save", "",
		"--appendonly", "no",
		// A master otherwise waits 5s for more replicas before the first sync.
		"--repl-diskless-sync-delay", "0",
	)
	if s.busPort != 0 {
		a = append(a, "--cluster-port", strconv.Itoa(s.busPort))
	}
	return append(a, s.extra...)
}

// launchLocked starts the process and waits until it answers. It returns an
// error wrapping errAddrInUse if redis-server could not bind its port.
func (s *Server) launchLocked() error {
	p, logStart, err := startProcess(s.bin, s.dir, s.logPath, s.argv())
	if err != nil {
		return err
	}
	s.proc, s.paused = p, false

	if err := waitReady(p, s.Port, "", s.command); err != nil {
		if stopErr := s.stopLocked(); stopErr != nil {
			return errors.Join(err, stopErr)
		}
		if strings.Contains(s.logSince(logStart), "Address already in use") {
			return fmt.Errorf("%w: %v", errAddrInUse, err)
		}
		return err
	}
	return nil
}

// stopLocked kills the process group, if running, and waits until the
// process has been reaped. A paused process is continued as well, so
// nothing is left stopped.
func (s *Server) stopLocked() error {
	if err := stopProcess(s.proc, s.paused); err != nil {
		return err
	}
	s.proc, s.paused = nil, false
	return nil
}

// Client returns a go-redis client for the server, with Addr (and Password,
// if the server was started with --requirepass) preset before opt are
// applied. The client is closed in tb.Cleanup.
func (s *Server) Client(tb testing.TB, opt ...func(*redis.Options)) *redis.Client {
	tb.Helper()
	return newClient(tb, &redis.Options{Addr: s.Addr, Password: s.password}, opt)
}

// newClient applies opt to o and returns a client with the result, closed in tb.Cleanup.
func newClient(tb testing.TB, o *redis.Options, opt []func(*redis.Options)) *redis.Client {
	tb.Helper()
	for _, f := range opt {
		f(o)
	}
	c := redis.NewClient(o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// NoRetries is a client option for [Server.Client], [Proxy.Client] and [Mini]: it turns go-redis's
// retries off (MaxRetries -1), so that each call that fails reports its own error at once.
func NoRetries(o *redis.Options) { o.MaxRetries = -1 }

// As returns a client option for [Server.Client] and [Proxy.Client] that authenticates as the ACL
// user name with password, without retries (see [NoRetries]): a user the server refuses, or one
// whose permissions a command lacks, fails the call at once.
func As(name, password string) func(*redis.Options) {
	return func(o *redis.Options) { o.Username, o.Password, o.MaxRetries = name, password, -1 }
}

// Kill sends SIGKILL to the server and waits until it has exited, so its
// port is free when Kill returns. A paused server is killed too; killing
// a server that is not running is a no-op.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(); err != nil {
		tb.Fatalf("redistest: kill %s: %v", s.Addr, err)
	}
}

// Restart kills the server if it is running, then starts it again on the
// same port with the same arguments and waits until it answers. Data and the
// script cache are lost; a cluster node keeps its identity (nodes.conf) and
// a sentinel its configuration file.
//
// If the port is briefly busy, Restart retries for up to 5s.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(); err != nil {
		tb.Fatalf("redistest: restart %s: %v", s.Addr, err)
	}
	deadline := time.Now().Add(restartPortTimeout)
	for {
		err := s.launchLocked()
		if err == nil {
			return
		}
		if !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			tb.Fatalf("redistest: restart redis-server on %s: %v\nlog tail (%s):\n%s", s.Addr, err, s.logPath, s.logTail(logTailLines))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pause stops the server with SIGSTOP and returns once it is stopped: it
// keeps its connections and port, but answers nothing, like a hung host.
// Commands time out until [Server.Resume]. A paused server need not be
// resumed: Kill, Restart and the cleanup kill it as well.
func (s *Server) Pause(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		tb.Fatalf("redistest: pause %s: server is not running", s.Addr)
	}
	if err := stopGroup(s.proc.pid); err != nil {
		tb.Fatalf("redistest: pause %s: %v", s.Addr, err)
	}
	s.paused = true
	if err := waitStopped(s.proc.pid, 5*time.Second); err != nil {
		tb.Fatalf("redistest: pause %s: %v", s.Addr, err)
	}
}

// Resume continues a server stopped by [Server.Pause] with SIGCONT.
// Replies to commands sent while it was paused are delivered then.
func (s *Server) Resume(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		tb.Fatalf("redistest: resume %s: server is not running", s.Addr)
	}
	if err := contGroup(s.proc.pid); err != nil {
		tb.Fatalf("redistest: resume %s: %v", s.Addr, err)
	}
	s.paused = false
}

// Hung pauses s ([Server.Pause]: a hung host, which accepts connections and
// answers nothing), calls call(i) for i from 0 to n-1, failing tb for each
// call that takes bound or longer (see [Timed]; "what i on a hung Redis"
// names it), then resumes s.
func (s *Server) Hung(tb testing.TB, what string, n int, bound time.Duration, call func(i int)) {
	tb.Helper()
	s.Pause(tb)
	for i := range n {
		Timed(tb, fmt.Sprintf("%s %d on a hung Redis", what, i), bound, func() { call(i) })
	}
	s.Resume(tb)
}

// CommandStats returns the number of calls per command from INFO
// commandstats, keyed by lower-case command name without the "cmdstat_"
// prefix: "evalsha", "set", and subcommands such as "script|load".
//
// The harness's own commands count too (an "info" per call, an "auth" when
// the server has a password); call [Server.ResetStats] before the code under
// test and compare only the commands it sends.
func (s *Server) CommandStats(tb testing.TB) map[string]int64 {
	tb.Helper()
	info, ok := s.Do(tb, "INFO", "commandstats").(string)
	if !ok {
		tb.Fatalf("redistest: INFO commandstats on %s: reply is not a string", s.Addr)
	}
	stats, err := parseCommandStats(info)
	if err != nil {
		tb.Fatalf("redistest: INFO commandstats on %s: %v", s.Addr, err)
	}
	return stats
}

// ResetStats resets the server's statistics with CONFIG RESETSTAT.
func (s *Server) ResetStats(tb testing.TB) {
	tb.Helper()
	s.Do(tb, "CONFIG", "RESETSTAT")
}

// Do sends one command on a new, short-lived connection (authenticated if
// the server has a password) and returns the RESP2 reply: a string for
// simple and bulk strings, int64 for integers, []any for arrays, nil for a
// null reply. An error reply, a network error or no reply within 5s fails
// the test.
//
// Do does not use go-redis, so it sends nothing but the command (and AUTH).
func (s *Server) Do(tb testing.TB, args ...any) any {
	tb.Helper()
	return do(tb, s.Addr, s.command, args)
}

// command is Do without a testing.TB.
func (s *Server) command(ctx context.Context, args ...any) (any, error) {
	return command(ctx, s.Addr, s.password, nil, args...)
}

// live reports whether the process is running and not paused.
func (s *Server) live() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.paused {
		return false
	}
	select {
	case <-s.proc.done:
		return false
	default:
		return true
	}
}

// logTail returns the last n lines of the server's log.
func (s *Server) logTail(n int) string { return tailFile(s.logPath, n) }

// logSince returns up to 1 MiB of the log written after offset off.
func (s *Server) logSince(off int64) string { return readFrom(s.logPath, off) }

// parseCommandStats parses the reply of INFO commandstats, whose lines look
// like "cmdstat_evalsha:calls=3,usec=42,usec_per_call=14.00,...".
func parseCommandStats(info string) (map[string]int64, error) {
	stats := make(map[string]int64)
	for line := range strings.Lines(info) {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok {
			return nil, fmt.Errorf("malformed line %q", line)
		}
		found := false
		for f := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("malformed calls in %q: %w", line, err)
				}
				stats[strings.ToLower(name)] = n
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("no calls= in %q", line)
		}
	}
	return stats, nil
}

// infoField returns the value of "name:value" in an INFO reply, or "".
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
