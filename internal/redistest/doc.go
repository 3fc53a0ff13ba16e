// Package redistest starts real redis-server processes for tests: standalone
// servers ([Start]), Redis Cluster ([StartCluster]) and Sentinel setups
// ([StartSentinel]), plus an in-process TCP [Proxy] for fault injection.
//
// Every server listens on a free loopback port chosen by the package, keeps
// no data on disk (save "" and appendonly no, with its working directory in
// tb.TempDir), and is killed in tb.Cleanup. The package only ever signals the
// processes it started, by PID (with any child a server forked, through its
// process group), and never touches a Redis already running on
// the machine (such as the system one on port 6379).
//
// # Missing binary
//
// When redis-server is not in PATH, [Binary] (and so every Start function)
// skips the test with a message saying how to install it. When the
// environment variable CI is "true", it fails the test instead, so a CI run
// cannot silently skip the real-Redis tests.
//
// # Failure injection
//
// A [Server] can be killed ([Server.Kill]), restarted on the same port with
// empty data and an empty script cache ([Server.Restart]), or hung with
// SIGSTOP ([Server.Pause], undone by [Server.Resume]). A [Proxy] adds
// latency, cuts connections, or holds traffic in both directions
// ([Proxy.Blackhole]) without touching the server.
//
// # Processes
//
// Each redis-server runs in its own process group, so a terminal's Ctrl-C
// reaches only the test binary; on Linux the process also gets SIGKILL when
// the test binary dies (Pdeathsig), so an interrupted run leaves no
// orphans. The server's stdout, stderr and log go to one file in its
// temporary directory; its tail is printed when a server fails to start, and
// when the test that started it has failed.
//
// The helpers call tb.Fatalf, so, like t.FailNow, they must be called from
// the goroutine running the test, not from goroutines it starts.
package redistest
