package concurrency_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// The helper process: the test binary run again with helperEnv set to "<redis addr> <key> <leases>
// <limit> <ttl>". It acquires the leases, prints "acquired <n>" and waits to be killed.
const helperEnv = "CONCURRENCY_TEST_HELPER"

func helperMain() int {
	f := strings.Fields(os.Getenv(helperEnv))
	if len(f) != 5 {
		fmt.Fprintln(os.Stderr, "helper: want addr key leases limit ttl")
		return 2
	}
	n, _ := strconv.Atoi(f[2])
	limit, _ := strconv.Atoi(f[3])
	ttl, _ := time.ParseDuration(f[4])
	rdb := redis.NewClient(&redis.Options{Addr: f[0]})
	lim, err := concurrency.New(rdb, concurrency.WithTimeout(5*time.Second), concurrency.WithFailurePolicy(outcome.FailClosed))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	got := 0
	for range n {
		ls, err := lim.TryAcquire(context.Background(), f[1], limit, ttl)
		if err != nil || ls.Source() != outcome.SourceCentral {
			fmt.Fprintln(os.Stderr, "helper: acquire:", err)
			return 2
		}
		if ls.Acquired() {
			got++
		}
	}
	fmt.Printf("acquired %d\n", got)
	select {} // hold the leases until SIGKILL
}

// TestHolderKilledMidLease: a process that holds leases dies by SIGKILL without releasing them; its
// slots come back once the TTL has passed on Redis's clock, and not before.
func TestHolderKilledMidLease(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lim := newLimiter(t, srv)
	const key, leases, limit, ttl = "tenant-killed", 3, 4, 1500 * time.Millisecond

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d %d %s", helperEnv, srv.Addr, key, leases, limit, ttl))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	start := time.Now() // the child's leases were all taken after this instant
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the helper died before acquiring")
	require.Equal(t, fmt.Sprintf("acquired %d\n", leases), line)

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	require.Less(t, time.Since(start), ttl/2, "the machine is too slow for this test's TTL")

	ctx := context.Background()
	n, err := lim.InFlight(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, leases, n, "the dead holder's leases are still counted before their TTL")
	ls, err := lim.TryAcquire(ctx, key, limit, time.Minute)
	require.NoError(t, err)
	require.True(t, ls.Acquired(), "one slot was free")
	full, err := lim.TryAcquire(ctx, key, limit, time.Minute)
	require.NoError(t, err)
	assert.False(t, full.Acquired(), "the dead holder's slots are not free before the TTL")
	assert.Greater(t, full.RetryAfter(), time.Duration(0))
	assert.LessOrEqual(t, full.RetryAfter(), ttl)

	// Poll until the dead holder's slots are back. Its leases were taken one after the other, so they
	// may expire one after the other, but none before the TTL.
	var first, freed time.Time
	for deadline := time.Now().Add(ttl + 5*time.Second); time.Now().Before(deadline); {
		n, err := lim.InFlight(ctx, key)
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, 1, "ls is still held")
		if n <= leases && first.IsZero() {
			first = time.Now()
		}
		if n == 1 { // only ls
			freed = time.Now()
			break
		}
		wait(t, 10*time.Millisecond)
	}
	require.False(t, freed.IsZero(), "the dead holder's slots never came back")
	assert.GreaterOrEqual(t, first.Sub(start), ttl, "a slot came back before the TTL")
	got := acquireAll(t, lim, key, limit, leases+1)
	assert.Equal(t, limit-1, got, "all the dead holder's slots are free again")
	require.NoError(t, ls.Release(ctx))
}

// wait pauses the test for d: the TTL tests need real time to pass on Redis's clock.
func wait(t *testing.T, d time.Duration) {
	t.Helper()
	tm := time.NewTimer(d)
	defer tm.Stop()
	<-tm.C
}
