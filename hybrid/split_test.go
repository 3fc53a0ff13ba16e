package hybrid_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
)

// TestHotKeySplitCountsExactly (issue 24): eight goroutines on each of two limiters decide on one hot
// key whose allowance each node has split per core (local.Entry.Split: contention splits it; the
// test splits it at once where contention has not yet), while the syncer reports every 20ms; after a
// flush, Redis counts exactly the tokens the two nodes admitted, and each node's Stats().Local the
// decisions it made locally.
func TestHotKeySplitCountsExactly(t *testing.T) {
	srv, rdb := startRedis(t)
	f := newFleet(t, srv.Addr, 2, hybrid.WithSyncInterval(20*time.Millisecond))
	limit := hybrid.Limit{Rate: 1e9, Burst: 1e9} // never exhausted: every decision a take from the lease
	var (
		admitted, local [2]atomic.Int64
		stop            atomic.Bool
		wg              sync.WaitGroup
	)
	for n, lim := range f.lims {
		for range 8 {
			wg.Go(func() {
				ctx := context.Background()
				for !stop.Load() {
					d, err := lim.DecideN(ctx, "hot", limit, 1+int64(n))
					if err == nil && d.Allowed {
						admitted[n].Add(1 + int64(n))
						if d.Source == outcome.SourceLocal {
							local[n].Add(1)
						}
					}
				}
			})
		}
	}
	sum := func() int64 { return admitted[0].Load() + admitted[1].Load() }
	for n, lim := range f.lims {
		require.Eventually(t, func() bool { return admitted[n].Load() > 0 }, 10*time.Second, time.Millisecond)
		if hybrid.SplitKey(lim, "hot") {
			t.Logf("node %d: split by the test (contention had not yet)", n)
		}
		assert.EqualValues(t, 1, hybrid.Splits(lim), "node %d", n)
	}
	// Then many reports, grants, refills and drains on the split key: 300,000 tokens more.
	base := sum()
	assert.Eventually(t, func() bool { return sum() > base+300_000 }, 20*time.Second, time.Millisecond)
	stop.Store(true)
	wg.Wait()
	f.flush(t)
	for n, lim := range f.lims {
		assert.Equal(t, local[n].Load(), lim.Stats().Local, "node %d: every local decision counted once", n)
	}
	assert.Equal(t, sum(), consumedByKey(t, rdb, hybrid.DefaultKeyPrefix)["hot"], "Redis counts exactly the tokens admitted")
}
