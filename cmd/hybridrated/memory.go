package main

import (
	"context"
	"runtime/debug"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
)

// releaseMin is how many keys must have left the hybrid limiters' memory since the last release
// before returnMemory gives the memory back: about 20 MB at some 300 bytes a key.
const releaseMin = 65_536

// returnMemory gives the OS back the memory of keys that went idle, every interval (the idle
// eviction's) until ctx ends: when the keys the limiters hold have fallen by
// releaseMin or more, and to half their peak or less, since the last release, it runs
// debug.FreeOSMemory.
//
// Why: idle eviction frees the keys' memory to the Go runtime, but the runtime collects only once
// the heap grows to twice what was live at the last collection, and keeps the pages until its
// scavenger gets to them. A sidecar that held a million keys (about 360 MB) and then idled measured
// 700 MB resident without this, 90 MB with it (BenchmarkRSS, docs/benchmarks.md). A forced
// collection costs a few milliseconds of CPU per 100 MB live; it runs only after such a fall, when
// traffic is low. The library leaves this to the program that owns the process; hybridrated is one.
func returnMemory(ctx context.Context, interval time.Duration, limiters func() []*hybrid.Limiter) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	peak := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := 0
		for _, l := range limiters() {
			n += l.Stats().Keys
		}
		peak = max(peak, n)
		if peak-n >= releaseMin && n <= peak/2 {
			debug.FreeOSMemory()
			peak = n
		}
	}
}
