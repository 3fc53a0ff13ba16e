// Package central is the hybrid limiter's side of Redis: key naming with hash tags, the synchronous
// take, the pipelined batch reconcile (reconcile.lua), and the ban list. The Redis plumbing it shares
// with package strict (the circuit breaker, EVALSHA with NOSCRIPT recovery, also inside pipelines,
// error classes, and the Cluster slot-map reload after a failover) lives in internal/redisx; the
// strict algorithms and the shaper live in package strict.
//
// A [Client] is safe for concurrent use. It does no I/O in [New]; scripts are loaded on first use and
// reloaded when a server answers NOSCRIPT (after a restart, SCRIPT FLUSH or failover).
//
// # Exactly once
//
// Go-redis re-sends a command after a read timeout unless the client's MaxRetries is -1, and a reconcile
// that timed out may or may not have run. The reconcile script is idempotent instead: a node sends its
// cumulative consumption per key (not a delta) and the script applies only what it has not applied yet;
// a take carries an id and a replay returns the stored verdict. Re-sending is therefore always safe, and
// the client does re-send a batch once after NOSCRIPT.
//
// This package is a building block of package hybrid and may move under internal/ before v1.
package central
