//go:build !unix

package cputime

import "time"

// Process returns 0 where getrusage is missing: benchmarks then report no CPU per operation.
func Process() time.Duration { return 0 }
