//go:build unix

package main

import "syscall"

// processCPU is the CPU time this process has used (user and system), in nanoseconds: on a
// machine shared with other work, CPU per operation moves less than time per operation.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
