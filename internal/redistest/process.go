package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"
)

// startProcess starts bin with argv in dir, in its own process group, with its stdout and stderr
// appended to the log at logPath, and reaps it in a goroutine that closes the process's done. It
// returns the process and the log's size before the start, where the process's own lines begin.
func startProcess(bin, dir, logPath string, argv []string) (*process, int64, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	logStart := fi.Size()

	cmd := exec.Command(bin, argv...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f // an *os.File is handed to the child: no copying goroutine
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	f.Close()
	if err != nil {
		return nil, 0, err
	}
	p := &process{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, logStart, nil
}

// waitReady polls the new process p, through ask, until it answers INFO with
// its own PID, which also proves that port is not served by some other
// process. over names the transport in the timeout error (" over TLS", or "").
func waitReady(p *process, port int, over string, ask func(ctx context.Context, args ...any) (any, error)) error {
	deadline := time.Now().Add(readyTimeout)
	var lastErr error
	for {
		select {
		case <-p.done:
			return fmt.Errorf("redis-server exited during startup: %v", p.err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		v, err := ask(ctx, "INFO", "server")
		cancel()
		if err == nil {
			info, _ := v.(string)
			if pid, _ := strconv.Atoi(infoField(info, "process_id")); pid == p.pid {
				return nil
			}
			err = fmt.Errorf("port %d answered by another process (%q)", port, infoField(info, "process_id"))
		}
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer%s within %v: %w", over, readyTimeout, lastErr)
		}
		time.Sleep(pollInterval)
	}
}

// stopProcess kills p's process group, if p is running (and continues it
// when paused, so nothing is left stopped), and waits until p has been
// reaped. A nil p is a no-op.
func stopProcess(p *process, paused bool) error {
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
	default:
		// Not reaped yet, so the process group still belongs to us.
		if err := killGroup(p.pid); err != nil {
			return fmt.Errorf("kill pid %d: %w", p.pid, err)
		}
		if paused {
			_ = contGroup(p.pid)
		}
	}
	timer := time.NewTimer(exitTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		return fmt.Errorf("redis-server pid %d did not exit within %v of SIGKILL", p.pid, exitTimeout)
	}
	return nil
}
