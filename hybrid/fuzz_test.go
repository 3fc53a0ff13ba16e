package hybrid_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// validLimit is Limit.Validate's documented contract, written out independently.
func validLimit(l hybrid.Limit) bool {
	return !math.IsNaN(l.Rate) && !math.IsInf(l.Rate, 0) && l.Rate >= 1e-9 && l.Rate <= 1e9 && l.Burst >= 1 && l.Burst <= 1e9
}

// FuzzLimitValidate: Validate accepts exactly the limits its documentation allows, and its error
// always wraps ErrInvalidLimit. It runs its seeds in a plain go test.
func FuzzLimitValidate(f *testing.F) {
	for _, s := range []struct {
		rate  float64
		burst int64
	}{
		{10, 10}, {0, 1}, {-1, 1}, {math.NaN(), 1}, {math.Inf(1), 1}, {math.Inf(-1), 1}, {1e9, 1e9}, {1e9 + 1, 1},
		{1, 0}, {1, 1e9 + 1}, {math.SmallestNonzeroFloat64, 1}, {1.0 / 3600, 1}, {1, math.MaxInt64}, {1, math.MinInt64},
	} {
		f.Add(s.rate, s.burst)
	}
	f.Fuzz(func(t *testing.T, rate float64, burst int64) {
		l := hybrid.Limit{Rate: rate, Burst: burst}
		err := l.Validate()
		if (err == nil) != validLimit(l) {
			t.Fatalf("Validate(%+v) = %v", l, err)
		}
		if err != nil && !errors.Is(err, hybrid.ErrInvalidLimit) {
			t.Fatalf("Validate(%+v) = %v, not ErrInvalidLimit", l, err)
		}
		for _, mk := range []func(int64) hybrid.Limit{hybrid.PerSecond, hybrid.PerMinute, hybrid.PerHour} {
			if p := mk(burst); (p.Validate() == nil) != (burst >= 1 && burst <= 1e9) {
				t.Fatalf("%+v from burst %d: %v", p, burst, p.Validate())
			}
		}
	})
}

// FuzzAllowN: AllowN on a miniredis-backed limiter never panics, returns the documented error for
// every bad input (ErrInvalidKey, ErrInvalidLimit, ErrInvalidCost), and otherwise a decision with no
// error and sane fields. It runs its seeds in a plain go test.
func FuzzAllowN(f *testing.F) {
	_, rdb := redistest.Mini(f)
	lim, err := hybrid.New(rdb, hybrid.WithCheckTimeout(time.Second))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		_ = lim.Close(context.Background())
		_ = rdb.Close()
	})
	for _, s := range []struct {
		key   string
		rate  float64
		burst int64
		n     int64
	}{
		{"k", 10, 10, 1}, {"", 10, 10, 1}, {"k", 10, 10, 0}, {"k", 10, 10, 11}, {"k", 10, 10, -1},
		{"k", math.NaN(), 10, 1}, {"k", math.Inf(1), 10, 1}, {"k", 0, 10, 1}, {"k", 10, 0, 1},
		{"{tenant}:a}b{", 1, 1, 1}, {"a\x00b", 1e9, 1e9, 1e9}, {strings.Repeat("k", 1025), 1, 1, 1},
		{strings.Repeat("k", 1024), 1.0 / 3600, 5, 5}, {"tiny", 1e-300, 1, 1}, {"small", 5e-10, 1, 1},
		{"big", 1e9, 1, 1}, {" ", 0.5, 3, 2}, {"日本", 123.456, 7, 3},
	} {
		f.Add(s.key, s.rate, s.burst, s.n)
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, key string, rate float64, burst int64, n int64) {
		l := hybrid.Limit{Rate: rate, Burst: burst}
		d, err := lim.DecideN(ctx, key, l, n)
		var want error
		switch {
		case len(key) == 0 || len(key) > hybrid.MaxKeyLen:
			want = hybrid.ErrInvalidKey
		case !validLimit(l) || rate < 1e-9: // the scripts' minimum rate (limits.MinRate)
			want = hybrid.ErrInvalidLimit
		case n < 1 || n > burst:
			want = hybrid.ErrInvalidCost
		}
		if want != nil {
			if !errors.Is(err, want) {
				t.Fatalf("AllowN(%q, %+v, %d) = %v, want %v", key, l, n, err, want)
			}
			if d.Allowed {
				t.Fatalf("AllowN(%q, %+v, %d) allowed with an error", key, l, n)
			}
			return
		}
		if err != nil {
			t.Fatalf("AllowN(%q, %+v, %d): unexpected error %v", key, l, n, err)
		}
		switch {
		case d.Source == 0:
			t.Fatalf("decision without a source: %+v", d)
		case d.Allowed && d.RetryAfter != 0:
			t.Fatalf("allowed with a retry-after: %+v", d)
		case d.RetryAfter < 0 || d.ResetAfter < 0 || d.Remaining < 0:
			t.Fatalf("negative field: %+v", d)
		case d.Limit != l:
			t.Fatalf("decision for %+v under %+v", d.Limit, l)
		}
	})
}
