package every

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestTickCallsUntilTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		Tick(ctx, time.Millisecond, func() {
			if n.Add(1) == 5 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Tick did not return after its context ended")
	}
	if got := n.Load(); got != 5 {
		t.Fatalf("fn ran %d times after the context ended at the fifth call, want 5", got)
	}
}

func TestPacedCallsAtOnceAndWaitsWhatFnReturns(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls []time.Time
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		Paced(ctx, func() time.Duration {
			calls = append(calls, time.Now())
			if len(calls) == 3 {
				cancel()
			}
			return time.Duration(len(calls)) * 20 * time.Millisecond
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Paced did not return after its context ended")
	}
	if len(calls) != 3 {
		t.Fatalf("fn ran %d times, want 3", len(calls))
	}
	if first := calls[0].Sub(start); first > 15*time.Millisecond {
		t.Errorf("the first call came %v after the start, want at once", first)
	}
	// The waits fn asked for: 20 ms after the first call, 40 ms after the second.
	for i, want := range []time.Duration{20 * time.Millisecond, 40 * time.Millisecond} {
		if got := calls[i+1].Sub(calls[i]); got < want {
			t.Errorf("wait %d was %v, want at least %v", i+1, got, want)
		}
	}
}

func TestTickReturnsAtOnceOnAnEndedContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	Tick(ctx, time.Hour, func() { ran = true })
	Paced(ctx, func() time.Duration { return time.Hour })
	if ran {
		t.Fatal("Tick ran fn on a context that had ended")
	}
}
