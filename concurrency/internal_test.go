package concurrency

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

func TestFallbackSemaphore(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		ms      int    // time of the step
		op      string // "acquire", "release", "extend", "count"
		id      uint64
		ok      bool          // acquired, released, extended
		n       int           // leases held after the step (acquire, count)
		wait    time.Duration // acquire denied: until the earliest expiry
		ttlMS   int           // acquire, extend
		capShot int           // acquire: capacity
	}
	steps := []step{
		{ms: 0, op: "acquire", id: 1, ok: true, n: 1, ttlMS: 100, capShot: 2},
		{ms: 10, op: "acquire", id: 2, ok: true, n: 2, ttlMS: 50, capShot: 2},
		{ms: 20, op: "acquire", id: 3, ok: false, n: 2, wait: 40 * time.Millisecond, ttlMS: 100, capShot: 2},
		{ms: 59, op: "count", n: 2},
		{ms: 60, op: "count", n: 1}, // lease 2 expired at 60
		{ms: 60, op: "acquire", id: 3, ok: true, n: 2, ttlMS: 100, capShot: 2},
		{ms: 70, op: "release", id: 2, ok: false}, // expired: not held
		{ms: 70, op: "release", id: 3, ok: true},
		{ms: 71, op: "release", id: 3, ok: false}, // twice
		{ms: 90, op: "extend", id: 1, ok: true, ttlMS: 100},
		{ms: 150, op: "count", n: 1}, // lease 1 now lives until 190
		{ms: 190, op: "extend", id: 1, ok: false, ttlMS: 100},
		{ms: 190, op: "count", n: 0},
	}
	var f fallback
	for i, s := range steps {
		now := at(s.ms)
		switch s.op {
		case "acquire":
			ok, n, wait := f.acquire("k", s.id, s.capShot, time.Duration(s.ttlMS)*time.Millisecond, now)
			if ok != s.ok || n != s.n || wait != s.wait {
				t.Errorf("step %d: acquire(%d) = %v, %d, %v; want %v, %d, %v", i, s.id, ok, n, wait, s.ok, s.n, s.wait)
			}
		case "release":
			if got := f.release("k", s.id, now); got != s.ok {
				t.Errorf("step %d: release(%d) = %v, want %v", i, s.id, got, s.ok)
			}
		case "extend":
			if got := f.extend("k", s.id, time.Duration(s.ttlMS)*time.Millisecond, now); got != s.ok {
				t.Errorf("step %d: extend(%d) = %v, want %v", i, s.id, got, s.ok)
			}
		case "count":
			if got := f.count("k", now); got != s.n {
				t.Errorf("step %d: count = %d, want %d", i, got, s.n)
			}
		}
	}
	if got := len(f.keys); got != 0 {
		t.Errorf("%d keys left after their last lease, want 0", got)
	}
}

func TestShare(t *testing.T) {
	for _, tc := range []struct{ limit, nodes, want int }{
		{20, 1, 20}, {20, 4, 5}, {20, 3, 6}, {2, 8, 1}, {1, 1, 1},
	} {
		if got := share(tc.limit, tc.nodes); got != tc.want {
			t.Errorf("share(%d, %d) = %d, want %d", tc.limit, tc.nodes, got, tc.want)
		}
	}
}

func TestDecodeReply(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want reply
		bad  bool
	}{
		{in: []any{int64(1), int64(3), int64(0)}, want: reply{ok: true, inFlight: 3}},
		{in: []any{int64(0), int64(5), int64(1200)}, want: reply{inFlight: 5, waitMS: 1200}},
		{in: nil, bad: true},
		{in: "OK", bad: true},
		{in: []any{int64(1), int64(3)}, bad: true},
		{in: []any{int64(1), "3", int64(0)}, bad: true},
		{in: []any{int64(2), int64(3), int64(0)}, bad: true},
		{in: []any{int64(1), int64(-1), int64(0)}, bad: true},
		{in: []any{int64(0), int64(1), int64(-5)}, bad: true},
	} {
		got, err := decodeReply(tc.in)
		if tc.bad {
			if !errors.Is(err, errBadReply) {
				t.Errorf("decodeReply(%#v) = %+v, %v; want errBadReply", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("decodeReply(%#v) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want fault
	}{
		{nil, faultNone},
		{context.Canceled, faultCanceled},
		{context.DeadlineExceeded, faultRedis},
		{errors.New("dial tcp: connection refused"), faultRedis},
		{redis.ErrClosed, faultRedis},
		{proto("OOM command not allowed when used memory > 'maxmemory'."), faultRedis},
		{proto("READONLY You can't write against a read only replica."), faultRedis},
		{proto("NOAUTH Authentication required."), faultRedis},
		{proto("WRONGTYPE Operation against a key holding the wrong kind of value"), faultKey},
		{proto("ERR hybridrate: bad limit"), faultKey},
		{fmt.Errorf("%w: 3 elements", errBadReply), faultKey},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// proto is an error reply as go-redis returns it.
type proto string

func (p proto) Error() string { return string(p) }
func (p proto) RedisError()   {}

func TestRedisKeyIsInjective(t *testing.T) {
	seen := map[string]string{}
	for _, k := range []string{"a", "a}", "}a", "a}b", "{a}", "a:b", "a:v1:c:{b", "\x00"} {
		rk := redisKey("hr", k)
		if prev, ok := seen[rk]; ok {
			t.Errorf("keys %q and %q share Redis key %q", prev, k, rk)
		}
		seen[rk] = k
	}
}

func TestOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, opt := range []Option{
		WithKeyPrefix(""), WithKeyPrefix("a{b"), WithKeyPrefix("a b"), WithFailurePolicy(outcome.FailurePolicy(9)),
		WithNodes(0), WithTimeout(0), WithTimeout(time.Minute), WithLogger(nil), nil,
	} {
		_, err := New(rdb, opt)
		assert.ErrorIs(t, err, ErrBadOption)
	}
	_, err := New(nil)
	assert.Error(t, err)
	lim, err := New(rdb, WithKeyPrefix("app"), WithFailurePolicy(outcome.FailClosed), WithNodes(4), WithTimeout(time.Second))
	if assert.NoError(t, err) {
		assert.Equal(t, "app", lim.o.prefix)
		assert.Equal(t, outcome.FailClosed, lim.o.policy)
		assert.Equal(t, 4, lim.o.nodes)
	}
	assert.Equal(t, "fail-closed", outcome.FailClosed.String())
	assert.Equal(t, "FailurePolicy(9)", outcome.FailurePolicy(9).String())
	assert.Equal(t, "fallback", outcome.SourceFallback.String())
	assert.Equal(t, "central", outcome.SourceCentral.String())
}

func TestHeldLeasesAreSwept(t *testing.T) {
	_, rdb := redistest.Mini(t)
	lim, err := New(rdb, WithTimeout(time.Second)) // a loaded machine must not send a take to the fallback
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	lim.o.now = func() time.Time { return now }
	ctx := context.Background()
	take := func() *Lease {
		t.Helper()
		ls, err := lim.TryAcquire(ctx, "k", MaxLimit, time.Second)
		if err != nil || !ls.Acquired() {
			t.Fatalf("TryAcquire: %v, %v", ls, err)
		}
		return ls
	}
	var first *Lease
	for i := range minSweep - 1 {
		ls := take()
		if i == 0 {
			first = ls
		}
	}
	if got := len(lim.held); got != minSweep-1 {
		t.Fatalf("%d leases held, want %d", got, minSweep-1)
	}
	now = now.Add(3 * time.Second) // every lease so far has surely expired (ttl 1s, timeout 1s)
	last := take()
	if got, want := len(lim.held), 1; got != want {
		t.Errorf("%d leases held after the sweep, want %d", got, want)
	}
	if err := first.Release(ctx); err != nil {
		t.Errorf("releasing a swept lease: %v", err)
	}
	if err := last.Release(ctx); err != nil {
		t.Error(err)
	}
	if got := len(lim.held); got != 0 {
		t.Errorf("%d leases held after the last release, want 0", got)
	}
}
