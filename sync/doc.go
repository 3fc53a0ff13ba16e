// Package sync (imported as ratesync) is the background reconciler of package hybrid: it collects
// the keys a limiter consumed locally, sends their cumulative consumption to Redis in pipelined
// batches, and turns each answer into a new local allowance.
//
// A [Syncer] never blocks the hot path: requests only bump counters and push a key onto a lock-free
// dirty list. A flush that fails leaves its keys dirty, so the next round carries their consumption
// again (the reconcile script applies it exactly once); a slow flush makes the next one larger rather
// than queueing rounds. New starts nothing; Run owns the loop until its context ends.
//
// Import it as:
//
//	ratesync "github.com/hybridrate/hybridrate/sync"
package sync
