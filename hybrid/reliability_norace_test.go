//go:build !race

package hybrid_test

// raceEnabled reports whether the race detector is on; slow tests scale their work down with it.
const raceEnabled = false
