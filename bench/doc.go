// Package bench holds hybridrate's Go benchmarks, side by side with the limiters it replaces, all in
// one run and against a real redis-server that the benchmarks start themselves (package
// internal/redistest; without redis-server in PATH they skip, unless CI=true):
//
//   - BenchmarkAllow: hybrid Allow on keys with local allowance (1k keys, 1M keys under Zipf, one
//     hot key; serial and b.RunParallel), next to a per-key map of golang.org/x/time/rate limiters
//     behind a mutex and a bare Go map lookup at the same key sets.
//   - BenchmarkCentral: one Redis round trip per decision: a strict Lua token bucket, go-redis's
//     redis_rate, and hybrid with a drift threshold of 0 (every decision in Redis).
//   - BenchmarkReconcile: pipelined reconcile throughput of central.Client.Reconcile, in keys/s.
//
// TestAllowLocalAllocatesNothing pins the zero-allocation hot path. Run the benchmarks with
//
//	go test ./bench -run '^$' -bench . -benchmem -count 10 | tee new.txt
//	benchstat new.txt
//
// The package has no non-test code besides this comment.
package bench
