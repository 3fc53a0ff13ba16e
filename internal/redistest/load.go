package redistest

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// maxLoadFactor caps LoadFactor: a bound stretched further than this no longer tells a slow
// answer from a hung one.
const maxLoadFactor = 10

// LoadFactor returns how much a wall-clock bound should stretch on this machine now: the
// one-minute load average per CPU, from 1 to 10 (1 where it cannot be read). The machines that run
// these tests are shared; at a load of 12 on 2 cores a 50 ms timeout's answer took 230–400 ms, where
// on an idle machine it takes 51–55 ms. A hang is still caught: it does not end.
func LoadFactor() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 1
	}
	load, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 1
	}
	return min(max(load/float64(runtime.NumCPU()), 1), maxLoadFactor)
}

// Stretch returns bound × LoadFactor().
func Stretch(bound time.Duration) time.Duration {
	return time.Duration(float64(bound) * LoadFactor())
}
