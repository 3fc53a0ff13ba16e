package lua

import _ "embed"

//go:embed reconcile.lua
var reconcile string

// Reconcile returns the source of the reconcile script, which applies nodes' cumulative consumption to
// global token buckets, optionally takes n tokens, and returns each bucket's state. reconcile.lua
// documents its KEYS, ARGV and reply. The source starts with a "#!lua" line (Redis 7 script flags);
// servers without shebang support need [StripShebang].
func Reconcile() string { return reconcile }

// StripShebang returns src without a leading "#!" line, for Redis-compatible servers that predate
// Redis 7 script flags (Redis 6, miniredis). Without the shebang, Redis Cluster does not enforce
// that the script touches only its declared keys; the scripts declare them all anyway.
func StripShebang(src string) string {
	if len(src) < 2 || src[:2] != "#!" {
		return src
	}
	for i := 0; i < len(src); i++ {
		if src[i] == '\n' {
			return src[i+1:]
		}
	}
	return ""
}

//go:embed ban.lua
var ban string

// Ban returns the source of the ban-list script (ban, unban, list); ban.lua documents its contract.
func Ban() string { return ban }
