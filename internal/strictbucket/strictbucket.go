// Package strictbucket holds the strict central token bucket that hybridrate is compared with:
// one Lua call per decision, refilled by Redis TIME (strict_bucket.lua documents its keys,
// arguments and reply). The load generator's "central" peer (cmd/loadgen/internal/peers) and the
// benchmarks in bench/ run this one script, so both measure the same peer.
package strictbucket

import _ "embed"

//go:embed strict_bucket.lua
var source string

// Source returns the source of the strict central token-bucket script, strict_bucket.lua.
func Source() string { return source }
