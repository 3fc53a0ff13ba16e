package concurrency_test

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// quiet discards go-redis's own log lines (dial failures after a test kills Redis on purpose).
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	redis.SetLogger(quiet{})
	goleak.VerifyTestMain(m)
}
