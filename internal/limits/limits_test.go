package limits

import (
	"math"
	"testing"
	"time"
)

func TestCheckRate(t *testing.T) {
	t.Parallel()
	for i, c := range []struct {
		rate  float64
		burst int64
		ok    bool
	}{
		{1, 1, true}, {MinRate, 1, true}, {MaxRate, MaxBurst, true}, {0.5, 3, true},
		{0, 1, false}, {MinRate / 2, 1, false}, {MaxRate * 1.5, 1, false}, {-1, 1, false},
		{math.NaN(), 1, false}, {math.Inf(1), 1, false}, {math.Inf(-1), 1, false},
		{1, 0, false}, {1, -1, false}, {1, MaxBurst + 1, false}, {1, math.MaxInt64, false},
	} {
		if got := CheckRate(c.rate, c.burst) == nil; got != c.ok {
			t.Errorf("%d: CheckRate(%v, %d) valid = %v, want %v", i, c.rate, c.burst, got, c.ok)
		}
	}
}

func TestCheckWindow(t *testing.T) {
	t.Parallel()
	for i, c := range []struct {
		limit  int64
		period time.Duration
		ok     bool
	}{
		{1, time.Second, true}, {MaxLimit, MaxPeriod, true}, {1, MinPeriod, true},
		{0, time.Second, false}, {MaxLimit + 1, time.Second, false}, {-1, time.Second, false},
		{1, MinPeriod - 1, false}, {1, MaxPeriod + 1, false}, {1, math.MaxInt64, false}, {1, 0, false},
	} {
		if got := CheckWindow(c.limit, c.period) == nil; got != c.ok {
			t.Errorf("%d: CheckWindow(%d, %v) valid = %v, want %v", i, c.limit, c.period, got, c.ok)
		}
	}
}

func TestCheckRateAllocatesNothingWhenValid(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = CheckRate(10, 10) }); n != 0 {
		t.Errorf("CheckRate allocates %v times per valid call, want 0", n)
	}
}

func TestRateOKAgreesWithCheckRate(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1, 0, MinRate / 2, MinRate, 1, MaxRate, MaxRate * 1.5} {
		for _, burst := range []int64{-1, 0, 1, MaxBurst, MaxBurst + 1} {
			if got, want := RateOK(rate, burst), CheckRate(rate, burst) == nil; got != want {
				t.Errorf("RateOK(%v, %d) = %v, CheckRate says %v", rate, burst, got, want)
			}
		}
	}
}
