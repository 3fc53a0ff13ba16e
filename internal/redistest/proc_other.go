//go:build !unix

package redistest

import (
	"syscall"
	"time"
)

// supported reports whether this system can run the harness: the harness
// needs process groups and SIGSTOP, which this system lacks.
const supported = false

func sysProcAttr() *syscall.SysProcAttr                { return nil }
func killGroup(pid int) error                          { return errUnsupportedOS }
func stopGroup(pid int) error                          { return errUnsupportedOS }
func contGroup(pid int) error                          { return errUnsupportedOS }
func waitStopped(pid int, timeout time.Duration) error { return errUnsupportedOS }
