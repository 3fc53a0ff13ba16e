package main

import (
	"context"
	"fmt"
	"runtime/metrics"
	"strconv"
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

// DefaultGCHeadroomMiB is HYBRIDRATED_GC_HEADROOM_MIB's default (-gc-headroom-mib): the collector
// runs once the heap has grown at least 64 MiB past what the last collection found live.
const DefaultGCHeadroomMiB = 64

// gcLiveFloor is the least live heap gcPercent assumes, so that its percentage stays bounded.
const gcLiveFloor = 1 << 20

// gcPercent is the GC percentage (GOGC) that puts the collector's heap goal at least headroom bytes
// above a live heap of live bytes: the default, 100, once the live heap is larger than headroom
// (the goal is then twice the live heap, as without this), more below it.
//
// Why: a sidecar's live heap is small (a few MB with thousands of keys) while every gRPC call
// allocates about 10 KB in the gRPC stack, so at the default the collector would run dozens of
// times a second, each run costing CPU and, through its assists and pauses, the calls' tail
// latency. A heap goal at least headroom above the live heap makes that a few times a second, for
// at most headroom more resident memory; a large live heap (a million keys) keeps the default, and
// GOMEMLIMIT still bounds the total.
func gcPercent(live, headroom uint64) int {
	live = max(live, gcLiveFloor)
	return max(100, int(headroom*100/live))
}

// keepGCHeadroom sets the GC percentage to gcPercent of the live heap (live) now and every
// interval until ctx ends, through set (debug.SetGCPercent in hybridrated), when it changed by more
// than a tenth; when ctx ends, it sets the default, 100, back. headroom 0 does nothing.
func keepGCHeadroom(ctx context.Context, interval time.Duration, headroom uint64, live func() uint64, set func(int) int) {
	if headroom == 0 || interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	cur := 100
	defer func() {
		if cur != 100 {
			set(100)
		}
	}()
	for {
		if p := gcPercent(live(), headroom); p*10 > cur*11 || p*10 < cur*9 {
			set(p)
			cur = p
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// liveHeap returns the heap the last collection found live, in bytes (runtime/metrics).
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// parseGCHeadroom reads HYBRIDRATED_GC_HEADROOM_MIB's value (a count of MiB, 0 or more; empty:
// the default) and returns the headroom in bytes. A GOGC in the environment (gogc not empty) is
// the operator's choice: the headroom is then 0, off.
func parseGCHeadroom(v, gogc string) (uint64, error) {
	mib := uint64(DefaultGCHeadroomMiB)
	if v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("HYBRIDRATED_GC_HEADROOM_MIB %q: want a count of MiB, 0 or more", v)
		}
		mib = n
	}
	if gogc != "" {
		return 0, nil
	}
	return mib << 20, nil
}
