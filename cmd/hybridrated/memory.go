package main

import (
	"context"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
)

// releaseMin is how many keys must have left the hybrid limiter's memory since the last release
// before returnMemory gives the memory back: about 20 MB at some 300 bytes a key.
const releaseMin = 65_536

// returnMemory gives the OS back the memory of keys that went idle, checking every interval (the idle
// eviction's) until ctx ends: when the keys the limiter holds (keys) have fallen by releaseMin or
// more, and to half their peak or less, since the last release, it calls release
// (debug.FreeOSMemory in hybridrated).
//
// Why: idle eviction frees the keys' memory to the Go runtime, but the runtime collects only once
// the heap grows to twice what was live at the last collection, and keeps the pages until its
// scavenger gets to them. A process that held a million keys (about 400 MB resident) and then idled
// measured 640 MB resident without a forced collection, 42 MB with one (BenchmarkRSS,
// docs/benchmarks.md). A forced collection costs a few milliseconds of CPU per 100 MB live; it runs
// only after such a fall, when traffic is low. The library leaves this to the program that owns the
// process; hybridrated is one.
func returnMemory(ctx context.Context, interval time.Duration, keys func() int, release func()) {
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
		n := keys()
		peak = max(peak, n)
		if peak-n >= releaseMin && n <= peak/2 {
			release()
			peak = n
		}
	}
}

// heldKeys returns the keys the limiter holds in local memory; 0 while it has none (nil).
func heldKeys(limiter func() *hybrid.Limiter) func() int {
	return func() int {
		if l := limiter(); l != nil {
			return l.Stats().Keys
		}
		return 0
	}
}
