package main

import (
	"context"
	"runtime/metrics"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/every"
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
	peak := 0
	every.Tick(ctx, interval, func() {
		n := keys()
		peak = max(peak, n)
		if peak-n >= releaseMin && n <= peak/2 {
			release()
			peak = n
		}
	})
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

// The collector's setting while the live heap is small (tuneGC).
const (
	// gcHeadroom bounds the heap's goal that tuneGC sets: a GC percent above the runtime's default
	// (100) only while the live heap times (1 + percent/100) stays within gcHeadroom, so the heap
	// grows to at most gcHeadroom between collections where it would grow to less at the default
	// (at most 9.6 MiB more, with a live heap of 3.2 MiB).
	gcHeadroom = 16 << 20
	// gcMaxPercent is the highest GC percent tuneGC sets: a collection after the heap has grown by
	// 4 times what was live at the last one.
	gcMaxPercent = 400
)

// gcPercent is the GC percent tuneGC sets for a live heap of live bytes: gcMaxPercent while the
// heap's goal stays within gcHeadroom, less as the live heap grows, the runtime's default (100)
// from gcHeadroom/2 on.
func gcPercent(live uint64) int {
	if live == 0 {
		return gcMaxPercent
	}
	p := (gcHeadroom - min(live, gcHeadroom)) * 100 / live
	return int(max(100, min(gcMaxPercent, p)))
}

// tuneGC sets the collector's percent (set: debug.SetGCPercent) from the live heap (live, in bytes,
// as of the last collection), checking every interval until ctx ends; hybridrated runs it unless
// GOGC is set.
//
// Why: hybridrated serving upstream's windows holds a live heap of 2–3 MB, and at the runtime's
// default the collector ran about 18 times a second under rlsbench (8 callers, 2 cores), each cycle
// stopping the world twice (0.04–4.9 ms each on a loaded machine: it waits for every thread) and
// taking a processor for its mark phase: about 8% of the server's CPU in a profile, and the world
// stopped 0.85% of the time, the p99's share of the calls. With a heap goal of 16 MB instead of 6
// it ran 3.6 times a second; in 12 interleaved runs against the default its p99 fell from 0.42 to 0.35 of
// upstream's (median) and its CPU per call by about 7% (docs/benchmarks.md, issue 22's "Session
// 10"). A larger heap goal did not pay: 64 MiB above the live heap (session 8) doubled the CPU per
// call, every allocation then touching memory out of cache. So the heap's goal is bounded by
// gcHeadroom, and a process holding many keys runs at the default.
func tuneGC(ctx context.Context, interval time.Duration, live func() uint64, set func(int) int) {
	cur := -1
	every.Paced(ctx, func() time.Duration {
		if p := gcPercent(live()); p != cur {
			set(p)
			cur = p
		}
		return interval
	})
}

// liveHeap is the runtime's live heap as of the last collection (runtime/metrics' /gc/heap/live:bytes).
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
