package redistest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// sysProcAttr puts the server in its own process group, so a terminal's
// Ctrl-C goes to the test binary only, and has the kernel SIGKILL it when
// the test binary dies, so an interrupted run leaves no orphan.
//
// Pdeathsig fires when the OS thread that started the child exits; the Go
// runtime keeps its threads unless a goroutine exits while locked to one,
// which the harness never does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitStopped waits until the process is in the stopped state, so that
// Pause returns only once the server has really stopped answering.
func waitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		// The state follows the parenthesised command name: "pid (comm) T ...".
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d did not stop within %v", pid, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}
