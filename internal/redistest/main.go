package redistest

import (
	"context"
	"testing"

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
