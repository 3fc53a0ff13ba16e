package main

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// TestReturnMemoryAfterAFall checks when hybridrated forces memory back to the OS: once the keys
// held have fallen by releaseMin or more and to half their peak or less since the last release, and
// not on smaller or slower falls.
func TestReturnMemoryAfterAFall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		held := []int{0, 100_000, 200_000, 150_000, 100_001, 100_000, 90_000, 50_000, 40_000, 0, 0}
		var released []int // the ticks at which release ran
		tick := -1
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			returnMemory(ctx, time.Minute, func() int {
				tick++
				return held[min(tick, len(held)-1)]
			}, func() { released = append(released, tick) })
		}()
		time.Sleep(time.Duration(len(held))*time.Minute + time.Second)
		cancel()
		<-done
		// 200,000 → 100,000 (tick 5): a fall of 100,000 to half the peak. Then from 100,000: 50,000
		// is a fall of 50,000 (under releaseMin); 0 (tick 9) is a fall of 100,000 to under half.
		want := []int{5, 9}
		if len(released) != len(want) || released[0] != want[0] || released[1] != want[1] {
			t.Errorf("released at ticks %v, want %v", released, want)
		}
	})
}

// The collector's heap goal stays headroom above a small live heap, and at the default (twice the
// live heap) once the live heap is larger than headroom.
func TestGCPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, headroom uint64
		want           int
	}{
		{0, 64 * mib, 6400},       // no collection yet: a live heap of 1 MiB assumed
		{4 * mib, 64 * mib, 1600}, // the goal 68 MiB
		{64 * mib, 64 * mib, 100},
		{300 * mib, 64 * mib, 100}, // a million keys: the default
		{4 * mib, 0, 100},
	} {
		if got := gcPercent(c.live, c.headroom); got != c.want {
			t.Errorf("gcPercent(%d MiB, %d MiB) = %d, want %d", c.live/mib, c.headroom/mib, got, c.want)
		}
	}
}

// keepGCHeadroom follows the live heap, sets the percentage only on a change of more than a tenth,
// and sets the default back when it stops; GOGC in the environment or a headroom of 0 turns it off.
func TestKeepGCHeadroom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const mib = 1 << 20
		live := []uint64{4 * mib, 4 * mib, 4*mib + mib/5, 8 * mib, 200 * mib, 200 * mib}
		var set []int
		tick := -1
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			keepGCHeadroom(ctx, time.Second, 64*mib, func() uint64 {
				tick++
				return live[min(tick, len(live)-1)]
			}, func(p int) int { set = append(set, p); return 0 })
		}()
		time.Sleep(time.Duration(len(live))*time.Second - time.Second/2)
		cancel()
		<-done
		want := []int{1600, 800, 100} // 4.2 MiB (1523) is within a tenth of 1600; 100 is set already at the end
		if len(set) != len(want) || set[0] != want[0] || set[1] != want[1] || set[2] != want[2] {
			t.Errorf("set %v, want %v", set, want)
		}
	})
	for _, c := range []struct {
		v, gogc string
		want    uint64
		err     bool
	}{
		{"", "", DefaultGCHeadroomMiB << 20, false},
		{"16", "", 16 << 20, false},
		{"0", "", 0, false},
		{"", "200", 0, false},
		{"-1", "", 0, true},
		{"lots", "", 0, true},
	} {
		got, err := parseGCHeadroom(c.v, c.gogc)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("parseGCHeadroom(%q, GOGC=%q) = %d, %v; want %d (error %v)", c.v, c.gogc, got, err, c.want, c.err)
		}
	}
}
