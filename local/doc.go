// Package local holds a limiter's in-process per-key state: for each key, the tokens this node has
// consumed (cumulative per incarnation), how much of that Redis has applied, and the mark up to which
// the node may consume without asking Redis (its local allowance).
//
// The store is sharded (64 shards) open-addressing tables: lookups are lock-free and allocation-free,
// inserts and evictions take one shard's mutex. Consumed-but-unapplied entries sit on per-shard
// lock-free dirty lists that the syncer collects. The key count is capped; eviction picks clean
// entries only (CLOCK order), so evicting a key never drops consumption Redis has not applied.
//
// The package has no goroutines, no clock and no I/O. It is a building block of package hybrid and
// may move under internal/ before v1.
package local
