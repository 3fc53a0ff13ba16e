package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// quiet is a go-redis logger that discards every line.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Main is a package's TestMain for tests that stop, kill or hang Redis on purpose: it discards
// go-redis's own log lines (the dial failures those tests cause), runs the tests, and fails the
// run if any goroutine outlives them (goleak.VerifyTestMain). It calls os.Exit, so it does not
// return.
func Main(m *testing.M) {
	redis.SetLogger(quiet{})
	goleak.VerifyTestMain(m)
}

// ClientSetup is a named change to a standalone client's options.
type ClientSetup struct {
	Name string
	Opt  func(*redis.Options)
}

// ClientSetups are the set-ups under which a hung-server test checks that a limiter bounds its
// calls whatever the client's options: go-redis's defaults (ContextTimeoutEnabled false: a call's
// deadline is not applied to the socket, ReadTimeout 3s), no read timeout at all (a call would wait
// forever), and ContextTimeoutEnabled. [ClusterClientSetups] are the same for cluster clients.
var ClientSetups = []ClientSetup{
	{"defaults", func(*redis.Options) {}},
	{"no read timeout", func(o *redis.Options) { o.ReadTimeout = -1 }},
	{"context timeouts", func(o *redis.Options) { o.ContextTimeoutEnabled = true }},
}

// ServerRun is what [ForEachClientSetup] hands each run: a redis-server of its own, a client made
// with one of [ClientSetups] (closed in the subtest's cleanup), and that set-up's name.
type ServerRun struct {
	Server *Server
	Client *redis.Client
	Name   string
}

// ForEachClientSetup is the frame of a hung-server test: it marks the test parallel and runs fn
// once per entry of [ClientSetups], in parallel subtests named after the set-ups, each on a
// redis-server of its own ([Start]).
func ForEachClientSetup(t *testing.T, fn func(t *testing.T, run ServerRun)) {
	t.Helper()
	t.Parallel()
	for _, tc := range ClientSetups {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			srv := Start(t)
			fn(t, ServerRun{Server: srv, Client: srv.Client(t, tc.Opt), Name: tc.Name})
		})
	}
}

// Timed runs f, logs how long it took as "<what>: <duration>", and reports a test error (not a
// fatal one: the test goes on) when that is bound or more, with bound stretched by the machine's
// load (Stretch: on an idle machine, bound itself). It returns the duration. A hung-server test
// wraps each call that must stay bounded in it.
func Timed(tb testing.TB, what string, bound time.Duration, f func()) time.Duration {
	tb.Helper()
	start := time.Now()
	f()
	took := time.Since(start)
	tb.Logf("%s: %v", what, took)
	if b := Stretch(bound); took >= b {
		tb.Errorf("%s took %v, want less than %v (%v stretched for a load factor of %.1f)", what, took, b, bound, LoadFactor())
	}
	return took
}
