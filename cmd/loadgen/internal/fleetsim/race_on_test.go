//go:build race

package fleetsim

// raceEnabled reports whether the tests were built with the race detector (see withoutRace).
const raceEnabled = true
