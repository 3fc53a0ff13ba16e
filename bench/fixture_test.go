package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// generous is a limit no benchmark comes near: after one Redis take per key, a node's local
// allowance is about DriftThreshold × Burst = 10⁸ tokens, so every timed decision is local.
var generous = hybrid.Limit{Rate: 1e9, Burst: 1e9}

// Key-set sizes.
const (
	smallKeys = 1 << 10 // "1k"
	largeKeys = 1 << 20 // "1M"
	zipfS     = 1.1     // skew of the 1M-key sequence
	seqLen    = 1 << 20 // length of pre-drawn key sequences (a power of two: index with a mask)
)

// names returns n key names, "user:0" …; built before any timer starts.
func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "user:" + strconv.Itoa(i)
	}
	return out
}

// uniformSeq returns seqLen key indexes drawn uniformly from n keys.
func uniformSeq(n int) []int32 {
	r := rand.New(rand.NewPCG(1, 2))
	seq := make([]int32, seqLen)
	for i := range seq {
		seq[i] = int32(r.IntN(n))
	}
	return seq
}

// zipfSeq returns seqLen key indexes drawn from n keys with Zipf skew s (key 0 hottest).
func zipfSeq(n int, s float64) []int32 {
	r := rand.New(rand.NewPCG(3, 4))
	z := rand.NewZipf(r, s, 1, uint64(n-1))
	seq := make([]int32, seqLen)
	for i := range seq {
		seq[i] = int32(z.Uint64())
	}
	return seq
}

// distinct returns the distinct indexes of seq.
func distinct(seq []int32) []int32 {
	seen := make(map[int32]bool, len(seq)/4)
	var out []int32
	for _, k := range seq {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// startRedis starts a redis-server for tb and returns a client with go-redis's retries off (as the
// library recommends: its reconciles are idempotent, and a retry would only add latency).
func startRedis(tb testing.TB) (*redistest.Server, *redis.Client) {
	tb.Helper()
	srv := redistest.Start(tb)
	return srv, srv.Client(tb, func(o *redis.Options) { o.MaxRetries = -1; o.PoolSize = 64 })
}

// newLimiter returns a hybrid limiter on rdb, closed at the end of tb.
func newLimiter(tb testing.TB, rdb redis.UniversalClient, opts ...hybrid.Option) *hybrid.Limiter {
	tb.Helper()
	lim, err := hybrid.New(rdb, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = lim.Close(ctx)
	})
	return lim
}

// warm makes a decision on every key in idx, which goes to Redis and brings the key its local
// allowance. A cold limiter decides by its failure policy while dialling and loading the script
// outlast the sync timeout (and many cold calls at once open its breaker), so the first key is
// warmed alone, the rest from 16 goroutines, and a decision Redis did not make is retried for up to
// 3s. The first 64 keys are then checked to decide locally.
func warm(tb testing.TB, lim *hybrid.Limiter, keys []string, idx []int32) {
	tb.Helper()
	ctx := context.Background()
	one := func(key string) error {
		deadline := time.Now().Add(3 * time.Second)
		for {
			d, err := lim.Decide(ctx, key, generous)
			if err != nil || d.Source == outcome.SourceCentral || d.Source == outcome.SourceLocal {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("key %s: still decided by %v", key, d.Source)
			}
			time.Sleep(20 * time.Millisecond) // let the breaker close
		}
	}
	if err := one(keys[idx[0]]); err != nil {
		tb.Fatalf("warm-up: %v", err)
	}
	const workers = 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1 + w; i < len(idx); i += workers {
				if err := one(keys[idx[i]]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatalf("warm-up: %v", err)
	}
	for _, i := range idx[:min(len(idx), 64)] {
		if d, err := lim.Decide(ctx, keys[i], generous); err != nil || d.Source != outcome.SourceLocal {
			tb.Fatalf("warm-up: key %s: decided by %v (err %v) after its Redis take, want local", keys[i], d.Source, err)
		}
	}
}

// all returns 0 … n-1.
func all(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i)
	}
	return out
}
