package concurrency_test

import (
	"os"
	"testing"

	"github.com/hybridrate/hybridrate/internal/redistest"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	redistest.Main(m)
}
