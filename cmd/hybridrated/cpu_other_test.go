//go:build !unix

package main

// processCPU is 0 where getrusage is missing: benchmarks then report no CPU per operation.
func processCPU() int64 { return 0 }
