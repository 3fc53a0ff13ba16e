package strict

import (
	"strings"

	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/lua"
)

// marker is the line of lua.Strict() that the algorithms replace.
const marker = "-- @algorithms\n"

// assemble returns the strict driver with the given algorithm sources spliced in at its marker.
func assemble(algorithms ...string) string {
	return strings.Replace(lua.Strict(), marker, strings.Join(algorithms, "\n"), 1)
}

// The assembled scripts: one per algorithm (so each has its own small script and SHA), one with every
// limiter for AllowMulti calls that mix algorithms, and the shaper (GCRA's state and arithmetic plus
// the leaky bucket's check).
var (
	fixedWindowScript = redisx.NewScript(assemble(lua.FixedWindow()))
	algoScripts       = [...]*redisx.Script{
		TokenBucket:    redisx.NewScript(assemble(lua.TokenBucket())),
		GCRA:           redisx.NewScript(assemble(lua.GCRA())),
		FixedWindow:    fixedWindowScript,
		SlidingWindow:  redisx.NewScript(assemble(lua.SlidingWindow())),
		SlidingLog:     redisx.NewScript(assemble(lua.SlidingLog())),
		UpstreamWindow: fixedWindowScript, // defined in fixed_window.lua, beside FixedWindow
	}
	allScript = redisx.NewScript(assemble(lua.TokenBucket(), lua.GCRA(), lua.FixedWindow(), lua.SlidingWindow(),
		lua.SlidingLog()))
	shaperScript = redisx.NewScript(assemble(lua.GCRA(), lua.LeakyBucket()))
)
