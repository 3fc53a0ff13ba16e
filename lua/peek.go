package lua

import _ "embed"

//go:embed peek.lua
var peek string

// Peek returns the source of the read-only bucket script, which reads one global token bucket
// refilled to Redis's current time; peek.lua documents its KEYS, ARGV and reply.
func Peek() string { return peek }
