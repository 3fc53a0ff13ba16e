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
