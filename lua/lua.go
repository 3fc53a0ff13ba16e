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

//go:embed bucketban.lua
var bucketBan string

// BucketBan returns the source of the script that keeps a key's ban in its bucket, where the
// reconcile and take scripts read it; bucketban.lua documents its contract.
func BucketBan() string { return bucketBan }

//go:embed strict.lua
var strict string

// Strict returns the source of the strict-limiting driver, which checks one or more rules and lets them
// all consume or none; strict.lua documents its KEYS, ARGV and reply. It is not a complete script: the
// algorithms it runs (the other strict sources below) are spliced in at its "-- @algorithms" line, which
// package central does once per set of algorithms.
func Strict() string { return strict }

//go:embed token_bucket.lua
var tokenBucket string

// TokenBucket returns the strict token bucket, an algorithm of [Strict]; token_bucket.lua documents it.
func TokenBucket() string { return tokenBucket }

//go:embed gcra.lua
var gcra string

// GCRA returns the generic cell rate algorithm, an algorithm of [Strict]; gcra.lua documents it.
func GCRA() string { return gcra }

//go:embed fixed_window.lua
var fixedWindow string

// FixedWindow returns the fixed window counter, an algorithm of [Strict]; fixed_window.lua documents it.
func FixedWindow() string { return fixedWindow }

//go:embed sliding_window.lua
var slidingWindow string

// SlidingWindow returns the sliding window counter, an algorithm of [Strict]; sliding_window.lua
// documents it.
func SlidingWindow() string { return slidingWindow }

//go:embed sliding_log.lua
var slidingLog string

// SlidingLog returns the sliding window log, an algorithm of [Strict]; sliding_log.lua documents it.
func SlidingLog() string { return slidingLog }

//go:embed leaky_bucket.lua
var leakyBucket string

// LeakyBucket returns the leaky-bucket shaper, an algorithm of [Strict] that needs [GCRA] spliced in
// before it; leaky_bucket.lua documents it.
func LeakyBucket() string { return leakyBucket }

//go:embed concurrency.lua
var concurrency string

// Concurrency returns the source of the in-flight lease script of package concurrency (acquire,
// release, extend, count); concurrency.lua documents its KEYS, ARGV and reply.
func Concurrency() string { return concurrency }

//go:embed fleet.lua
var fleet string

// Fleet returns the source of the fleet registry script (live nodes per key prefix, by heartbeat);
// fleet.lua documents its KEYS, ARGV and reply.
func Fleet() string { return fleet }

//go:embed take.lua
var take string

// Take returns the source of the one-off take script (n taken and counted at once from a bucket of
// reconcile.lua's layout, nothing leased); take.lua documents its KEYS, ARGV and reply.
func Take() string { return take }
