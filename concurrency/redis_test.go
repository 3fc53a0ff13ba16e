package concurrency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// newLimiter returns a Limiter on srv, with its own client (a node of its own), closed in Cleanup.
func newLimiter(tb testing.TB, srv *redistest.Server, opts ...concurrency.Option) *concurrency.Limiter {
	tb.Helper()
	rdb := srv.Client(tb, redistest.NoRetries)
	// A generous timeout: two cores shared with other test runs must not turn a slow call into a
	// failure-policy decision; the failure tests set their own.
	lim, err := concurrency.New(rdb, append([]concurrency.Option{concurrency.WithTimeout(2 * time.Second)}, opts...)...)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = lim.Close(context.Background()) })
	return lim
}

// acquireAll tries n leases for key (TTL one minute, never released) and returns how many it got
// from Redis; any other source fails the test.
func acquireAll(t *testing.T, lim *concurrency.Limiter, key string, limit, n int) int {
	t.Helper()
	got := 0
	for range n {
		ls, err := lim.TryAcquire(context.Background(), key, limit, time.Minute)
		require.NoError(t, err)
		require.Equal(t, outcome.SourceCentral, ls.Source())
		if ls.Acquired() {
			got++
		}
	}
	return got
}

func TestLimitIsExactAcrossNodes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const nodes, limit, callers = 4, 7, 6
	lims := make([]*concurrency.Limiter, nodes)
	for i := range lims {
		lims[i] = newLimiter(t, srv)
	}

	t.Run("a burst of acquirers gets exactly limit leases", func(t *testing.T) {
		var granted atomic.Int64
		var wg sync.WaitGroup
		for i := range nodes * callers {
			wg.Go(func() {
				ls, err := lims[i%nodes].TryAcquire(context.Background(), "burst", limit, time.Minute)
				if assert.NoError(t, err) && assert.Equal(t, outcome.SourceCentral, ls.Source()) && ls.Acquired() {
					granted.Add(1)
					assert.LessOrEqual(t, ls.InFlight(), limit)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int64(limit), granted.Load())
	})

	t.Run("holders that come and go never exceed the limit", func(t *testing.T) {
		var inFlight, peak, granted atomic.Int64
		var wg sync.WaitGroup
		for i := range nodes * callers {
			wg.Go(func() {
				lim := lims[i%nodes]
				for range 40 {
					ls, err := lim.Acquire(context.Background(), "churn", limit, time.Minute)
					if !assert.NoError(t, err) || !assert.Equal(t, outcome.SourceCentral, ls.Source()) {
						return
					}
					n := inFlight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					granted.Add(1)
					inFlight.Add(-1) // before Release: the count in Redis is never below ours
					assert.NoError(t, ls.Release(context.Background()))
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int64(nodes*callers*40), granted.Load(), "every Acquire got its lease in the end")
		assert.LessOrEqual(t, peak.Load(), int64(limit))
		n, err := lims[0].InFlight(context.Background(), "churn")
		require.NoError(t, err)
		assert.Equal(t, 0, n, "every lease was released")
	})
}

func TestReleaseFreesASlot(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, b := newLimiter(t, srv), newLimiter(t, srv)
	ctx := context.Background()
	const key, limit = "tenant-r", 2

	l1, err := a.TryAcquire(ctx, key, limit, time.Minute)
	require.NoError(t, err)
	l2, err := b.TryAcquire(ctx, key, limit, time.Minute)
	require.NoError(t, err)
	require.True(t, l1.Acquired() && l2.Acquired())
	l3, err := b.TryAcquire(ctx, key, limit, time.Minute)
	require.NoError(t, err)
	require.False(t, l3.Acquired(), "the key is full")
	assert.Equal(t, 2, l3.InFlight())
	assert.NoError(t, l3.Release(ctx), "releasing a lease that was not acquired does nothing")

	require.NoError(t, l1.Release(ctx))
	l4, err := b.TryAcquire(ctx, key, limit, time.Minute)
	require.NoError(t, err)
	assert.True(t, l4.Acquired(), "the released slot is free")

	t.Run("a second release does not free another holder's slot", func(t *testing.T) {
		require.NoError(t, l1.Release(ctx))
		n, err := a.InFlight(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		l5, err := a.TryAcquire(ctx, key, limit, time.Minute)
		require.NoError(t, err)
		assert.False(t, l5.Acquired())
	})

	t.Run("concurrent releases of one lease release it once", func(t *testing.T) {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { assert.NoError(t, l2.Release(ctx)) })
		}
		wg.Wait()
		n, err := a.InFlight(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, 1, n, "l4 is still held")
	})

	t.Run("extend after release reports the lease lost", func(t *testing.T) {
		ok, err := l1.Extend(ctx, time.Minute)
		require.NoError(t, err)
		assert.False(t, ok)
	})
}

func TestTTLReturnsUnreleasedSlots(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lim := newLimiter(t, srv)
	ctx := context.Background()
	const ttl = 300 * time.Millisecond

	start := time.Now()
	short, err := lim.TryAcquire(ctx, "ttl", 1, ttl)
	require.NoError(t, err)
	require.True(t, short.Acquired())
	for {
		ls, err := lim.TryAcquire(ctx, "ttl", 1, time.Minute)
		require.NoError(t, err)
		if ls.Acquired() {
			assert.GreaterOrEqual(t, time.Since(start), ttl, "the slot came back before the TTL")
			break
		}
		require.Less(t, time.Since(start), ttl+5*time.Second, "the slot never came back")
		wait(t, 10*time.Millisecond)
	}
	ok, err := short.Extend(ctx, time.Minute)
	require.NoError(t, err)
	assert.False(t, ok, "an expired lease cannot be extended (its slot is someone else's)")
	assert.NoError(t, short.Release(ctx), "releasing an expired lease is harmless")
	n, err := lim.InFlight(ctx, "ttl")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "releasing the expired lease did not release its successor")
	pttl, ok := srv.Do(t, "pttl", "hr:v1:c:{ttl}").(int64)
	require.True(t, ok)
	assert.Greater(t, pttl, int64(59_000), "the key lives as long as its last lease")
	assert.LessOrEqual(t, pttl, int64(60_001))
}

func TestExtendKeepsTheSlot(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lim := newLimiter(t, srv)
	ctx := context.Background()
	const ttl = 400 * time.Millisecond

	ls, err := lim.TryAcquire(ctx, "extend", 1, ttl)
	require.NoError(t, err)
	require.True(t, ls.Acquired())
	start := time.Now()
	for time.Since(start) < 3*ttl {
		ok, err := ls.Extend(ctx, ttl)
		require.NoError(t, err)
		require.True(t, ok, "the lease was lost after %v", time.Since(start))
		wait(t, ttl/4)
	}
	other, err := lim.TryAcquire(ctx, "extend", 1, ttl)
	require.NoError(t, err)
	assert.False(t, other.Acquired(), "the extended lease still holds the only slot after 3 TTLs")
	require.NoError(t, ls.Release(ctx))
	_, err = ls.Extend(ctx, 0)
	assert.ErrorIs(t, err, concurrency.ErrInvalidTTL)
}

func TestRedisStopped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy   outcome.FailurePolicy
		source   outcome.Source
		acquired int // of 5 tries with limit 6 and 3 nodes
	}{
		{outcome.LocalFallback, outcome.SourceFallback, 2},
		{outcome.FailOpen, outcome.SourceFallback, 5},
		{outcome.FailClosed, outcome.SourceFallback, 0},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			lim := newLimiter(t, srv, concurrency.WithFailurePolicy(tc.policy), concurrency.WithNodes(3),
				concurrency.WithTimeout(200*time.Millisecond))
			ctx := context.Background()
			held, err := lim.TryAcquire(ctx, "k", 6, time.Minute)
			require.NoError(t, err)
			require.True(t, held.Acquired())
			srv.Kill(t)

			got := 0
			var leases []*concurrency.Lease
			for range 5 {
				ls, err := lim.TryAcquire(ctx, "k", 6, time.Minute)
				require.NoError(t, err, "a Redis failure is never the caller's error")
				assert.Equal(t, tc.source, ls.Source())
				assert.Equal(t, tc.policy == outcome.FailClosed, ls.Unavailable())
				if ls.Acquired() {
					got++
					leases = append(leases, ls)
				} else {
					assert.Greater(t, ls.RetryAfter(), time.Duration(0))
				}
			}
			assert.Equal(t, tc.acquired, got)
			err = held.Release(ctx)
			assert.ErrorIs(t, err, concurrency.ErrUnavailable, "the release could not reach Redis")
			assert.Equal(t, int64(1), lim.Stats().ReleaseErrors)
			for _, ls := range leases {
				assert.NoError(t, ls.Release(ctx), "fallback leases are released locally")
			}
			if tc.policy == outcome.LocalFallback {
				ls, err := lim.TryAcquire(ctx, "k", 6, time.Minute)
				require.NoError(t, err)
				assert.True(t, ls.Acquired(), "a released fallback lease frees its local slot")
				require.NoError(t, ls.Release(ctx))
			}
			_, err = lim.InFlight(ctx, "k")
			assert.ErrorIs(t, err, concurrency.ErrUnavailable)

			srv.Restart(t)
			require.Eventually(t, func() bool {
				ls, err := lim.TryAcquire(ctx, "k", 6, time.Minute)
				if err != nil || ls.Source() != outcome.SourceCentral {
					return false
				}
				return assert.True(t, ls.Acquired()) && assert.NoError(t, ls.Release(ctx))
			}, 10*time.Second, 20*time.Millisecond, "Redis decides again once it is back")
		})
	}
}

func TestRedisRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		break_, mend [][]any // mend nil: the harness cannot talk to the server any more
	}{
		{"out of memory", [][]any{{"config", "set", "maxmemory", "1"}}, [][]any{{"config", "set", "maxmemory", "0"}}},
		{"read-only replica", [][]any{{"replicaof", "127.0.0.1", "1"}}, [][]any{{"replicaof", "no", "one"}}},
		// The limiter's connections are dropped, then a password is required: new ones get NOAUTH.
		{"authentication required", [][]any{{"client", "kill", "type", "normal"}, {"config", "set", "requirepass", "pw"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
			lim := newLimiter(t, srv, concurrency.WithFailurePolicy(outcome.FailClosed))
			ctx := context.Background()
			ok, err := lim.TryAcquire(ctx, "warm", 1, time.Minute) // a pooled connection, for the NOAUTH case
			require.NoError(t, err)
			require.Equal(t, outcome.SourceCentral, ok.Source())
			for _, cmd := range tc.break_ {
				srv.Do(t, cmd...)
			}
			ls, err := lim.TryAcquire(ctx, "k", 1, time.Minute)
			require.NoError(t, err, "a refusal is never the caller's error")
			assert.Equal(t, outcome.SourceFallback, ls.Source())
			assert.True(t, ls.Unavailable())
			assert.False(t, ls.Acquired())
			assert.Equal(t, int64(1), lim.Stats().RedisErrors)
			if tc.mend == nil {
				return
			}
			for _, cmd := range tc.mend {
				srv.Do(t, cmd...)
			}
			require.Eventually(t, func() bool {
				ls, err := lim.TryAcquire(ctx, "k", 1, time.Minute)
				return err == nil && ls.Source() == outcome.SourceCentral && ls.Acquired()
			}, 10*time.Second, 20*time.Millisecond)
		})
	}
}

func TestWrongTypeAffectsOnlyItsKey(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lim := newLimiter(t, srv, concurrency.WithFailurePolicy(outcome.FailClosed))
	ctx := context.Background()
	srv.Do(t, "set", "hr:v1:c:{squatted}", "not a sorted set")

	// More failures in a row than the breaker's threshold, over more than its minimum span.
	for i := range 20 {
		if i == 10 {
			wait(t, 100*time.Millisecond)
		}
		ls, err := lim.TryAcquire(ctx, "squatted", 3, time.Minute)
		require.NoError(t, err, "WRONGTYPE is never the caller's error")
		require.Equal(t, outcome.SourceFallback, ls.Source(), "try %d", i)
		require.True(t, ls.Unavailable(), "try %d", i)
	}
	assert.Equal(t, int64(20), lim.Stats().RedisErrors)
	ls, err := lim.TryAcquire(ctx, "other", 3, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, outcome.SourceCentral, ls.Source(), "other keys are unaffected: the breaker stays closed")
	assert.True(t, ls.Acquired())
	assert.Equal(t, "not a sorted set", srv.Do(t, "get", "hr:v1:c:{squatted}"), "the squatter's value is untouched")
}

func TestKeysStayInTheirNamespace(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lim := newLimiter(t, srv, concurrency.WithKeyPrefix("app"))
	ctx := context.Background()
	for _, key := range []string{"a}b", "{x}", "}", "app:v3:x:{bans}", "\x00", "a b\r\n"} {
		ls, err := lim.TryAcquire(ctx, key, 1, time.Minute)
		require.NoError(t, err)
		require.True(t, ls.Acquired(), "key %q", key)
		require.NoError(t, ls.Release(ctx))
		ls, err = lim.TryAcquire(ctx, key, 1, time.Minute)
		require.NoError(t, err)
		require.True(t, ls.Acquired(), "key %q", key)
	}
	keys, ok := srv.Do(t, "keys", "*").([]any)
	require.True(t, ok)
	assert.Len(t, keys, 6)
	for _, k := range keys {
		assert.Regexp(t, `^app:v1:c:\{`, k)
	}
}

func TestCanceledContext(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lim := newLimiter(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := lim.TryAcquire(ctx, "k", 1, time.Minute)
	assert.ErrorIs(t, err, context.Canceled)

	t.Run("Acquire gives up when its context ends", func(t *testing.T) {
		held, err := lim.TryAcquire(context.Background(), "k", 1, time.Minute)
		require.NoError(t, err)
		require.True(t, held.Acquired())
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		ls, err := lim.Acquire(ctx, "k", 1, time.Minute)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Nil(t, ls)
		require.NoError(t, held.Release(context.Background()))
	})

	t.Run("Release ignores a cancelled context", func(t *testing.T) {
		ls, err := lim.TryAcquire(context.Background(), "k", 1, time.Minute)
		require.NoError(t, err)
		require.True(t, ls.Acquired())
		require.NoError(t, ls.Release(ctx))
		n, err := lim.InFlight(context.Background(), "k")
		require.NoError(t, err)
		assert.Equal(t, 0, n)
	})
}

func TestAcquireWaitsForARelease(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, b := newLimiter(t, srv), newLimiter(t, srv)
	ctx := context.Background()
	held, err := a.TryAcquire(ctx, "w", 1, time.Minute)
	require.NoError(t, err)
	require.True(t, held.Acquired())
	got := make(chan *concurrency.Lease)
	go func() {
		ls, err := b.Acquire(ctx, "w", 1, time.Minute)
		assert.NoError(t, err)
		got <- ls
	}()
	select {
	case <-got:
		t.Fatal("Acquire returned while the only slot was held")
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, held.Release(ctx))
	ls := <-got
	assert.True(t, ls.Acquired())
	assert.NoError(t, ls.Release(ctx))
}

func TestCloseReleasesHeldLeases(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lim := newLimiter(t, srv)
	ctx := context.Background()
	released, err := lim.TryAcquire(ctx, "c", 5, time.Minute)
	require.NoError(t, err)
	require.NoError(t, released.Release(ctx))
	var leases []*concurrency.Lease
	for range 3 {
		ls, err := lim.TryAcquire(ctx, "c", 5, time.Minute)
		require.NoError(t, err)
		leases = append(leases, ls)
	}
	require.NoError(t, lim.Close(ctx))
	require.NoError(t, lim.Close(ctx), "a second Close does nothing")
	_, err = lim.TryAcquire(ctx, "c", 5, time.Minute)
	assert.ErrorIs(t, err, concurrency.ErrClosed)
	other := newLimiter(t, srv)
	n, err := other.InFlight(ctx, "c")
	require.NoError(t, err)
	assert.Equal(t, 0, n, "Close gave back every slot")
	for _, ls := range leases {
		assert.NoError(t, ls.Release(ctx), "releasing after Close is harmless")
	}
}

func TestInvalidArguments(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lim := newLimiter(t, srv)
	ctx := context.Background()
	for _, tc := range []struct {
		key   string
		limit int
		ttl   time.Duration
		want  error
	}{
		{"", 1, time.Second, concurrency.ErrInvalidKey},
		{string(make([]byte, concurrency.MaxKeyLen+1)), 1, time.Second, concurrency.ErrInvalidKey},
		{"k", 0, time.Second, concurrency.ErrInvalidLimit},
		{"k", -1, time.Second, concurrency.ErrInvalidLimit},
		{"k", concurrency.MaxLimit + 1, time.Second, concurrency.ErrInvalidLimit},
		{"k", 1, 0, concurrency.ErrInvalidTTL},
		{"k", 1, -time.Second, concurrency.ErrInvalidTTL},
		{"k", 1, concurrency.MaxTTL + 1, concurrency.ErrInvalidTTL},
	} {
		name := fmt.Sprintf("key of %d bytes, limit %d, ttl %v", len(tc.key), tc.limit, tc.ttl)
		_, err := lim.TryAcquire(ctx, tc.key, tc.limit, tc.ttl)
		assert.ErrorIs(t, err, tc.want, name)
		_, err = lim.Acquire(ctx, tc.key, tc.limit, tc.ttl)
		assert.ErrorIs(t, err, tc.want, name)
	}
	_, err := lim.InFlight(ctx, "")
	assert.ErrorIs(t, err, concurrency.ErrInvalidKey)
	assert.Empty(t, srv.Do(t, "keys", "*"), "nothing reached Redis")
	assert.False(t, errors.Is(concurrency.ErrInvalidKey, concurrency.ErrInvalidLimit))
}

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-master Redis Cluster")
	}
	t.Parallel()
	cl := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	var lims [2]*concurrency.Limiter
	for i := range lims {
		lim, err := concurrency.New(cl.Client(t), concurrency.WithTimeout(2*time.Second))
		require.NoError(t, err)
		t.Cleanup(func() { _ = lim.Close(ctx) })
		lims[i] = lim
	}
	// Keys that land on different masters, "}" included (the hash tag then ends early).
	for _, key := range []string{"tenant-a", "tenant-b", "tenant-c", "x}y", "{z}"} {
		got := 0
		var leases []*concurrency.Lease
		for i := range 6 {
			ls, err := lims[i%2].TryAcquire(ctx, key, 3, time.Minute)
			require.NoError(t, err)
			require.Equal(t, outcome.SourceCentral, ls.Source(), "key %q", key)
			if ls.Acquired() {
				got++
				leases = append(leases, ls)
			}
		}
		assert.Equal(t, 3, got, "key %q", key)
		for _, ls := range leases {
			require.NoError(t, ls.Release(ctx))
		}
		n, err := lims[0].InFlight(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, 0, n, "key %q", key)
	}
}

// concurrencyACL is the least-privilege ACL of docs/operations.md for package concurrency alone.
var concurrencyACL = []any{
	"on", ">pw", "resetkeys", "resetchannels", "~hr:*", "-@all",
	"+evalsha", "+eval", "+ping", "+hello",
	"+time", "+zremrangebyscore", "+zscore", "+zcard", "+zrange", "+zadd", "+zrem", "+pttl", "+pexpire", // run by the script
}

func TestLeastPrivilegeACL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Do(t, append([]any{"ACL", "SETUSER", "conc"}, concurrencyACL...)...)
	rdb := srv.Client(t, redistest.As("conc", "pw"))
	lim, err := concurrency.New(rdb, concurrency.WithFailurePolicy(outcome.FailClosed), concurrency.WithTimeout(2*time.Second))
	require.NoError(t, err)
	defer lim.Close(context.Background())
	ctx := context.Background()

	ls, err := lim.TryAcquire(ctx, "acl", 1, time.Minute)
	require.NoError(t, err)
	require.Equal(t, outcome.SourceCentral, ls.Source(), "the ACL allows acquiring")
	full, err := lim.TryAcquire(ctx, "acl", 1, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, outcome.SourceCentral, full.Source(), "and denying (ZRANGE for the wait)")
	assert.False(t, full.Acquired())
	ok, err := ls.Extend(ctx, time.Minute)
	require.NoError(t, err)
	assert.True(t, ok)
	require.NoError(t, ls.Release(ctx))
	n, err := lim.InFlight(ctx, "acl")
	require.NoError(t, err)
	assert.Equal(t, 0, n)
	assert.Equal(t, int64(0), lim.Stats().RedisErrors)
}

func TestCloseDuringAcquires(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lim := newLimiter(t, srv)
	ctx := context.Background()
	var granted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				ls, err := lim.TryAcquire(ctx, "closing", concurrency.MaxLimit, time.Minute)
				if errors.Is(err, concurrency.ErrClosed) {
					return
				}
				if !assert.NoError(t, err) {
					return
				}
				if ls.Acquired() {
					granted.Add(1) // never released by its holder: Close must give it back
				}
			}
		})
	}
	for granted.Load() < 50 {
		wait(t, time.Millisecond)
	}
	require.NoError(t, lim.Close(ctx))
	wg.Wait()
	n, err := newLimiter(t, srv).InFlight(ctx, "closing")
	require.NoError(t, err)
	assert.Equal(t, 0, n, "of %d leases granted, none outlives Close", granted.Load())
}

// TestInFlightGoesThroughTheBreaker: InFlight is guarded like every other call (issue 25): once the
// breaker is open it fails at once, with no call sent, and its error wraps ErrUnavailable.
func TestInFlightGoesThroughTheBreaker(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := concurrency.New(rdb, concurrency.WithFailurePolicy(outcome.FailClosed))
	require.NoError(t, err)
	t.Cleanup(func() { _ = lim.Close(context.Background()) })
	ctx := context.Background()
	for i := range 10 { // more failures than the breaker's threshold, over more than its minimum span
		if i == 5 {
			wait(t, 100*time.Millisecond)
		}
		ls, err := lim.TryAcquire(ctx, "k", 1, time.Minute)
		require.NoError(t, err)
		require.True(t, ls.Unavailable())
	}
	failed := lim.Stats().RedisErrors
	require.Less(t, failed, int64(10), "the breaker opened: later tries were not sent")
	_, err = lim.InFlight(ctx, "k")
	require.ErrorIs(t, err, concurrency.ErrUnavailable)
	assert.Contains(t, err.Error(), "circuit breaker open")
}
