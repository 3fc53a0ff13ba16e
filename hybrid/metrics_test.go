package hybrid_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/metrictest"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

func TestMetricsDecisionsBySourceWithStableInstance(t *testing.T) {
	_, rdb := redistest.Mini(t)
	metrics := metrictest.New(t)
	lim, err := hybrid.New(rdb, hybrid.WithMeterProvider(metrics.Provider), hybrid.WithInstance("pod-7"),
		hybrid.WithCheckTimeout(time.Second), hybrid.WithSyncInterval(time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = lim.Close(context.Background()) })

	ctx := context.Background()
	limit := hybrid.Limit{Rate: 0.001, Burst: 20}
	for i := 0; i < 40; i++ {
		_, err := lim.Allow(ctx, "user:1", limit)
		require.NoError(t, err)
	}
	require.NoError(t, lim.Flush(ctx))
	s := lim.Stats()
	require.Positive(t, s.LocalDenied+s.CentralDenied+s.DenyCache, "the key went over its limit")

	inst := attribute.String("hybridrate.instance", "pod-7")
	fp := attribute.String("hybridrate.failure_policy", "local-fallback")
	for _, c := range []struct {
		source, outcome string
		want            int64
	}{
		{"local", "allowed", s.Local}, {"local", "denied", s.LocalDenied},
		{"central", "allowed", s.Central}, {"central", "denied", s.CentralDenied},
		{"deny-cache", "denied", s.DenyCache},
	} {
		got, _ := metrics.Point(t, "hybridrate.decisions", inst, fp,
			attribute.String("source", c.source), attribute.String("outcome", c.outcome))
		assert.Equal(t, c.want, got, "%s/%s", c.source, c.outcome)
	}
	got, _ := metrics.Point(t, "hybridrate.sync.flushes", inst)
	assert.Equal(t, lim.Stats().Flushes, got)
	assert.Positive(t, got, "reconcile rounds are counted")
	got, _ = metrics.Point(t, "hybridrate.breaker.state", inst, attribute.String("state", "closed"))
	assert.EqualValues(t, 1, got)
	got, _ = metrics.Point(t, "hybridrate.breaker.checks.open", inst)
	assert.Zero(t, got)
	got, _ = metrics.Point(t, "hybridrate.redis.errors", inst, attribute.String("class", "error"))
	assert.Zero(t, got)
	_, attrs := metrics.Point(t, "hybridrate.keys", inst)
	_, ok := attrs.Value("hybridrate.node")
	assert.False(t, ok, "no per-limiter random id in metric attributes")
}

func TestMetricsRedisErrorsAndBreakerState(t *testing.T) {
	mr, rdb := redistest.Mini(t, redistest.NoRetries)
	metrics := metrictest.New(t)
	lim, err := hybrid.New(rdb, hybrid.WithMeterProvider(metrics.Provider), hybrid.WithFailurePolicy(outcome.FailOpen), hybrid.WithoutColdStart(),
		hybrid.WithCheckTimeout(100*time.Millisecond), hybrid.WithSyncInterval(time.Minute), hybrid.WithFlushTimeout(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = lim.Close(context.Background()) })

	mr.Close()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; !lim.Stats().BreakerOpen; i++ {
		require.True(t, time.Now().Before(deadline), "the breaker opens while Redis is down")
		d, err := lim.Decide(ctx, "cold:"+strconv.Itoa(i), hybrid.Limit{Rate: 1, Burst: 1})
		require.NoError(t, err)
		require.True(t, d.Allowed, "fail-open admits")
		// The checks time out (go-redis retries a refused dial for 400ms), which opens only the
		// checks' breaker; the reconciles of what fail-open admitted fail and open the breaker.
		require.Error(t, lim.Flush(ctx))
	}
	for i := 0; i < 5; i++ { // refused by the open breaker
		_, err := lim.Allow(ctx, "refused:"+strconv.Itoa(i), hybrid.Limit{Rate: 1, Burst: 1})
		require.NoError(t, err)
	}
	s := lim.Stats()
	fp := attribute.String("hybridrate.failure_policy", "fail-open")
	inst := attribute.String("hybridrate.instance", hybrid.DefaultInstance())
	got, _ := metrics.Point(t, "hybridrate.redis.errors", inst, fp, attribute.String("class", "error"))
	assert.Equal(t, s.RedisErrors, got)
	assert.Positive(t, got)
	got, _ = metrics.Point(t, "hybridrate.redis.errors", inst, fp, attribute.String("class", "breaker_open"))
	assert.Equal(t, s.RedisRejected, got)
	assert.Positive(t, got)
	got, _ = metrics.Point(t, "hybridrate.breaker.state", inst, attribute.String("state", s.Breaker))
	assert.EqualValues(t, 1, got)
	got, _ = metrics.Point(t, "hybridrate.breaker.state", inst, attribute.String("state", "closed"))
	assert.EqualValues(t, 0, got)
	got, _ = metrics.Point(t, "hybridrate.breaker.open", inst)
	assert.EqualValues(t, 1, got)
	got, _ = metrics.Point(t, "hybridrate.breaker.checks.open", inst)
	assert.EqualValues(t, 1, got, "the checks timed out: their breaker opened")
	assert.NotEqual(t, "closed", s.CheckBreaker)
	got, _ = metrics.Point(t, "hybridrate.decisions", inst, attribute.String("source", "fallback"), attribute.String("outcome", "allowed"))
	assert.Equal(t, s.FallbackAllowed, got)
}

func TestWithInstanceRejectsEmpty(t *testing.T) {
	_, rdb := redistest.Mini(t)
	_, err := hybrid.New(rdb, hybrid.WithInstance(""))
	assert.ErrorIs(t, err, hybrid.ErrBadOption)
}

// TestStatsLocalConvergesExactly: the fast path counts its decisions in the keys' entries, and
// Stats().Local gets them when the syncer visits the keys. Under concurrent decisions on shared keys
// (through AllowN and DecideN, with the syncer running every millisecond), no decision is lost from
// the count: after a Flush, every decision is counted once, by its source.
func TestStatsLocalConvergesExactly(t *testing.T) {
	_, rdb := redistest.Mini(t)
	lim, err := hybrid.New(rdb, hybrid.WithCheckTimeout(time.Second), hybrid.WithSyncInterval(time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = lim.Close(context.Background()) })
	ctx := context.Background()
	for !lim.Ready() {
		time.Sleep(time.Millisecond)
	}
	limit := hybrid.Limit{Rate: 1e9, Burst: 1e9}
	const goroutines, perG, keys = 4, 20_000, 7
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perG {
				k := "k" + strconv.Itoa((g+i)%keys)
				if i%2 == 0 {
					ok, err := lim.AllowN(ctx, k, limit, 1)
					if assert.NoError(t, err) && ok {
						allowed.Add(1)
					}
					continue
				}
				d, err := lim.DecideN(ctx, k, limit, 1)
				if assert.NoError(t, err) && d.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, lim.Flush(ctx))
	s := lim.Stats()
	assert.EqualValues(t, goroutines*perG, allowed.Load(), "a limit never reached")
	assert.EqualValues(t, goroutines*perG, s.Local+s.Central+s.FallbackAllowed, "every admission counted once: %+v", s)
	assert.Zero(t, s.LocalDenied+s.CentralDenied+s.DenyCache+s.FallbackDenied)
	assert.Greater(t, s.Local, int64(goroutines*perG*9/10), "most decisions were local")
}
