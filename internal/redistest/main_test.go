package redistest

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// eventually calls f every 10ms until it returns nil, and fails the test
// with f's last error if that does not happen within timeout.
func eventually(tb testing.TB, timeout time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("not within %v: %v", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
