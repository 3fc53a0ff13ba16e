package main

import (
	"context"
	"testing"
	"time"
)

func TestGCPercent(t *testing.T) {
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 400}, {1 << 20, 400}, {3 << 20, 400}, {4 << 20, 300}, {6 << 20, 166}, {8 << 20, 100},
		{16 << 20, 100}, {1 << 30, 100},
	} {
		if got := gcPercent(c.live); got != c.want {
			t.Errorf("gcPercent(%d) = %d, want %d", c.live, got, c.want)
		}
		if p := gcPercent(c.live); p > 100 && c.live*uint64(100+p)/100 > gcHeadroom {
			t.Errorf("gcPercent(%d) = %d: goal %d above gcHeadroom", c.live, p, c.live*uint64(100+p)/100)
		}
	}
}

func TestTuneGCSetsOnChange(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	lives := []uint64{2 << 20, 2 << 20, 64 << 20, 64 << 20, 1 << 20}
	var set []int
	done := make(chan struct{})
	i := 0
	go func() {
		defer close(done)
		tuneGC(ctx, time.Millisecond, func() uint64 {
			v := lives[min(i, len(lives)-1)]
			if i++; i >= len(lives) {
				cancel()
			}
			return v
		}, func(p int) int { set = append(set, p); return 0 })
	}()
	<-done
	if want := []int{400, 100, 400}; len(set) != len(want) || set[0] != want[0] || set[1] != want[1] || set[2] != want[2] {
		t.Fatalf("set %v, want %v", set, want)
	}
}
