//go:build unix

package redistest

import (
	"errors"
	"syscall"
)

// supported reports whether this system can run the harness.
const supported = true

// signalGroup sends sig to the process group led by pid: the redis-server and
// any child it forked (for example to stream an RDB to a replica).
func signalGroup(pid int, sig syscall.Signal) error {
	err := syscall.Kill(-pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil // already gone
	}
	return err
}

func killGroup(pid int) error { return signalGroup(pid, syscall.SIGKILL) }
func stopGroup(pid int) error { return signalGroup(pid, syscall.SIGSTOP) }
func contGroup(pid int) error { return signalGroup(pid, syscall.SIGCONT) }
