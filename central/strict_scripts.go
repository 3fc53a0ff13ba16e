package central

import (
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/lua"
)

// strictScript is one assembled strict script, with and without its "#!lua" line.
type strictScript struct {
	std    *redis.Script // for Redis 7+, which enforces the declared keys in a cluster
	legacy *redis.Script // for servers that reject the shebang (Redis 6, miniredis)
}

// strictMarker is the line of lua.Strict() that the algorithms replace.
const strictMarker = "-- @algorithms\n"

// assembleStrict returns the strict driver with the given algorithm sources spliced in at its marker.
func assembleStrict(algorithms ...string) string {
	return strings.Replace(lua.Strict(), strictMarker, strings.Join(algorithms, "\n"), 1)
}

func newStrictScript(algorithms ...string) strictScript {
	src := assembleStrict(algorithms...)
	return strictScript{std: redis.NewScript(src), legacy: redis.NewScript(lua.StripShebang(src))}
}

// The assembled scripts: one per algorithm (so each has its own small script and SHA), one with every
// limiter for AllowMulti calls that mix algorithms, and the shaper (GCRA's state and arithmetic plus
// the leaky bucket's check).
var (
	strictByAlgo = [...]strictScript{
		TokenBucket:   newStrictScript(lua.TokenBucket()),
		GCRA:          newStrictScript(lua.GCRA()),
		FixedWindow:   newStrictScript(lua.FixedWindow()),
		SlidingWindow: newStrictScript(lua.SlidingWindow()),
		SlidingLog:    newStrictScript(lua.SlidingLog()),
	}
	strictAll = newStrictScript(lua.TokenBucket(), lua.GCRA(), lua.FixedWindow(), lua.SlidingWindow(),
		lua.SlidingLog())
	strictShaper = newStrictScript(lua.GCRA(), lua.LeakyBucket())
)
