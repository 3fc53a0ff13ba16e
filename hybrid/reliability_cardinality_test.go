package hybrid_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// cardinality returns the number of distinct keys TestKeyCardinalityAttack sends and the local key
// cap. A million keys does not fit in the ~20s budget here: every new key costs one synchronous
// script call plus its share of a reconcile, about 95µs of Redis time per key measured on this
// 2-core machine (INFO commandstats, with other work running), so a million keys would take well
// over a minute. The default is the largest count that fits: 100,000 keys under a cap of 10,000
// (about 16-22s here) without the race detector. With it, decisions are several times slower
// (20,000 keys took 17s) and the whole -race run of the package must stay short, so it sends 5,000
// keys under a cap of 1,000: still five times the cap. HYBRIDRATE_CARDINALITY_KEYS overrides the
// key count, e.g. HYBRIDRATE_CARDINALITY_KEYS=1000000 on a bigger machine.
func cardinality(t *testing.T) (keys, maxKeys int) {
	keys, maxKeys = 100_000, 10_000
	if raceEnabled {
		keys, maxKeys = 5_000, 1_000
	}
	if s := os.Getenv("HYBRIDRATE_CARDINALITY_KEYS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "HYBRIDRATE_CARDINALITY_KEYS")
		keys = n
	}
	return keys, maxKeys
}

// TestKeyCardinalityAttack is issue #4 item 7: a client sends a huge number of distinct keys through
// one limiter with a small local key cap (10,000). Each key gets three decisions: the first goes to Redis
// (a new key has no allowance), the next two are local and leave consumption pending, so eviction
// runs with pending keys around. The local key count never exceeds the cap; every bucket in Redis
// has a TTL; and the consumed counters in Redis add up to exactly what was admitted, so eviction
// dropped nothing that was consumed.
func TestKeyCardinalityAttack(t *testing.T) {
	if testing.Short() {
		t.Skip("sends up to a million keys; run without -short")
	}
	n, maxKeys := cardinality(t)
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.MaxRetries = -1; o.PoolSize = 32 })
	lim := newLimiter(t, rdb, hybrid.WithMaxKeys(maxKeys), hybrid.WithCheckTimeout(time.Second))
	// A bucket of 100 refilled at 1/s lives 201s in Redis: longer than the test.
	limit := hybrid.Limit{Rate: 1, Burst: 100}
	const perKey = 3

	var admitted, errs, maxLocal atomic.Int64
	done := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() { // the local key count, sampled
		defer sampler.Done()
		for {
			if k := int64(lim.Stats().Keys); k > maxLocal.Load() {
				maxLocal.Store(k)
			}
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	const workers = 32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := w; i < n; i += workers {
				key := "card:" + strconv.Itoa(i)
				for range perKey {
					d, err := lim.Decide(ctx, key, limit)
					if err != nil {
						errs.Add(1)
						continue
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	flushed(t, lim, 30*time.Second)
	close(done)
	sampler.Wait()
	st := lim.Stats()
	// The speed of many keys is BenchmarkAllow's to measure (bench/, keys=1M-zipf); this test checks the cap.
	t.Logf("%d keys × %d decisions; local keys max %d (cap %d), now %d; evictions %d; stats %+v",
		n, perKey, maxLocal.Load(), maxKeys, st.Keys, st.Evictions, st)
	assert.Zero(t, errs.Load())
	assert.EqualValues(t, n*perKey, admitted.Load(), "every decision admitted (bucket of 100)")
	assert.LessOrEqual(t, maxLocal.Load(), int64(maxKeys), "local keys stay under the cap")
	assert.LessOrEqual(t, st.Keys, maxKeys)
	assert.Positive(t, st.Evictions)
	assert.Zero(t, st.Unrecorded, "every admission had local room to be recorded")

	// Every bucket in Redis: it has a TTL, and the consumed counters add up to what was admitted.
	ctx := context.Background()
	var buckets, noTTL, total int64
	iter := rdb.Scan(ctx, 0, bucketKeys("card:")+"*", 10_000).Iterator()
	batch := make([]string, 0, 1000)
	check := func() {
		pipe := rdb.Pipeline()
		ttls := make([]*redis.DurationCmd, len(batch))
		cs := make([]*redis.StringCmd, len(batch))
		for i, k := range batch {
			ttls[i] = pipe.PTTL(ctx, k)
			cs[i] = pipe.HGet(ctx, k, "b")
		}
		_, err := pipe.Exec(ctx)
		require.NoError(t, err)
		for i := range batch {
			if ttls[i].Val() <= 0 {
				noTTL++
			}
			c, err := bucketConsumed(cs[i].Val())
			require.NoError(t, err, batch[i])
			total += c
		}
		buckets += int64(len(batch))
		batch = batch[:0]
	}
	for iter.Next(ctx) {
		if k := iter.Val(); strings.HasPrefix(k, bucketKeys("card:")) {
			batch = append(batch, k)
		}
		if len(batch) == cap(batch) {
			check()
		}
	}
	require.NoError(t, iter.Err())
	check()
	t.Logf("Redis: %d buckets, %d without TTL, consumed %d", buckets, noTTL, total)
	assert.EqualValues(t, n, buckets, "one bucket per key")
	assert.Zero(t, noTTL, "every bucket has a TTL")
	assert.Equal(t, admitted.Load(), total, "nothing consumed was dropped on eviction")
}
