package hybrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// TestFleetRegistryCountsLiveLimiters (issue 21): limiters sharing a prefix count each other through
// the fleet registry; one that closes leaves it at once; the count sizes the cold-start credit so
// that the fleet's credits on a key add up to one burst at most.
func TestFleetRegistryCountsLiveLimiters(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const n = 3
	var lims []*hybrid.Limiter
	for range n {
		lims = append(lims, newLimiter(t, srv.Client(t), hybrid.WithFleetBeat(20*time.Millisecond),
			hybrid.WithCheckTimeout(time.Second)))
	}
	require.Eventually(t, func() bool {
		for _, l := range lims {
			// The ban list read too: no cold-start credit before it (issue 23, item 6).
			if l.FleetSize() != n || !l.Ready() {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond, "every limiter counts %d and has read the ban list", n)

	// Burst 4 over 3 nodes: each may grant itself 4/3 → 1 token for a key it has never seen (two on
	// a fleet of one). The first request is local, the second asks Redis.
	limit := hybrid.Limit{Rate: 1, Burst: 4}
	for i, l := range lims {
		key := fmt.Sprintf("cold:%d", i)
		d, err := l.Decide(ctx, key, limit)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Equal(t, outcome.SourceLocal, d.Source, "node %d: the first request is the cold-start credit's", i)
		d, err = l.Decide(ctx, key, limit)
		require.NoError(t, err)
		assert.Equal(t, outcome.SourceCentral, d.Source, "node %d: the second asks Redis: the credit was one token", i)
	}

	// Burst 2 over 3 nodes: under a token each: the first request of a new key asks Redis.
	d, err := lims[0].Decide(ctx, "cold:small", hybrid.Limit{Rate: 1, Burst: 2})
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, outcome.SourceCentral, d.Source, "no cold-start credit when the fleet outnumbers the burst")
	// That node sees the key for the first time: its decision was a one-off take, counted by Redis
	// at once, with no lease and no node record (the bucket and the one-off takes' demand).
	fields, err := srv.Client(t).HKeys(ctx, bucketKey("cold:small")).Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"b", "o"}, fields, "a one-off take writes no node record")
	require.NoError(t, lims[0].Flush(ctx))
	assert.Zero(t, lims[0].Stats().Pending, "nothing is left to report")

	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, lims[n-1].Close(cctx))
	require.Eventually(t, func() bool { return lims[0].FleetSize() == n-1 && lims[1].FleetSize() == n-1 },
		10*time.Second, 5*time.Millisecond, "a closed limiter leaves the registry")
}

// TestFleetStartingAtOnceIsCountedQuickly (issue 21): limiters that start together register one
// after another, so the first one's first heartbeat counts only itself. It beats again soon (not
// after its usual period) because the count it found was new, and learns the fleet's real size
// within about a second: before that, it sized its cold-start credit and leases for a fleet of
// one.
func TestFleetStartingAtOnceIsCountedQuickly(t *testing.T) {
	srv := redistest.Start(t)
	const n = 4
	var lims []*hybrid.Limiter
	for range n {
		// A heartbeat period far longer than the test: only the quick beat can update the count.
		lims = append(lims, newLimiter(t, srv.Client(t), hybrid.WithFleetBeat(time.Minute)))
		require.Eventually(t, func() bool { return lims[len(lims)-1].FleetSize() >= 1 }, 10*time.Second,
			time.Millisecond, "the limiter's first heartbeat")
	}
	assert.Less(t, lims[0].FleetSize(), int64(n), "the first limiter's first heartbeat found fewer than %d", n)
	require.Eventually(t, func() bool {
		for _, l := range lims {
			if l.FleetSize() != n {
				return false
			}
		}
		return true
	}, 5*time.Second, 5*time.Millisecond, "every limiter counts the whole fleet after a quick second heartbeat")
}

// TestNoColdCreditUntilTheFleetIsCounted (issue 21): a limiter that finds others at its first
// heartbeat is not Ready, and answers a new key from Redis, until a second heartbeat finds the fleet
// no longer growing; a limiter alone is Ready at its first. In a fleet that starts at once, the k-th
// node's first heartbeat counts k, and credit sized for that count over-admitted Zipf keys.
func TestNoColdCreditUntilTheFleetIsCounted(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	limit := hybrid.Limit{Rate: 10, Burst: 20} // a credit of 2 tokens on a fleet of up to 10
	first := newLimiter(t, srv.Client(t), hybrid.WithFleetBeat(time.Minute))
	require.Eventually(t, first.Ready, 5*time.Second, time.Millisecond, "a limiter alone is ready at its first heartbeat")
	d, err := first.Decide(ctx, "a", limit)
	require.NoError(t, err)
	assert.Equal(t, outcome.SourceLocal, d.Source, "the first limiter answers a new key from its credit")

	second := newLimiter(t, srv.Client(t), hybrid.WithFleetBeat(time.Minute))
	require.Eventually(t, func() bool { return second.BansLoaded() && second.FleetSize() == 2 }, 5*time.Second,
		time.Millisecond, "the second limiter's first heartbeat finds two")
	assert.False(t, second.Ready(), "a limiter that found others at its first heartbeat is not ready")
	d, err = second.Decide(ctx, "b", limit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, outcome.SourceCentral, d.Source, "no credit: the new key's first decision goes to Redis")

	// The quick second heartbeat (500 ms later; the minute-long period never comes) finds two again.
	require.Eventually(t, second.Ready, 5*time.Second, 5*time.Millisecond, "ready after a second heartbeat")
	d, err = second.Decide(ctx, "c", limit)
	require.NoError(t, err)
	assert.Equal(t, outcome.SourceLocal, d.Source, "credit once the fleet is counted")
}
