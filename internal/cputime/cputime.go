// Package cputime reads this process's CPU time for the benchmarks that report CPU per operation
// (cpu-ns/op) beside time per operation: on a machine shared with other work, the CPU a benchmark's
// process used moves less between runs than the wall-clock time it took. It is test support: no
// package of the library imports it.
package cputime

import (
	"testing"
	"time"
)

// Report stops b's timer and reports the process's CPU time since since (a [Process] reading taken
// when the timed loop began), per iteration, as the metric cpu-ns/op. It reports nothing where the
// CPU time cannot be read (since is 0) or b ran no iteration.
func Report(b *testing.B, since time.Duration) {
	b.StopTimer()
	if since == 0 || b.N == 0 {
		return
	}
	b.ReportMetric(float64(Process()-since)/float64(b.N), "cpu-ns/op")
}
