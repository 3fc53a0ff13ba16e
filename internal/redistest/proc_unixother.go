//go:build unix && !linux

package redistest

import (
	"syscall"
	"time"
)

// sysProcAttr puts the server in its own process group, so a terminal's
// Ctrl-C goes to the test binary only. Without Pdeathsig, a test binary
// killed before its cleanups run can leave servers behind on this system.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// waitStopped is a no-op here: SIGSTOP cannot be caught, and the caller's
// next command will hang as intended.
func waitStopped(pid int, timeout time.Duration) error { return nil }
