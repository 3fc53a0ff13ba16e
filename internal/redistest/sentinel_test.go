package redistest

import (
	"context"
	"fmt"
	"testing"
	"time"
)

func TestSentinelFailoverPromotesTheReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and 3 sentinels; skipped in -short mode")
	}
	t.Parallel()
	start := time.Now()
	s := StartSentinel(t)
	t.Logf("sentinels ready in %v", time.Since(start).Round(time.Millisecond))
	if got, want := len(s.SentinelAddrs), 3; got != want {
		t.Fatalf("len(SentinelAddrs) = %d, want %d", got, want)
	}
	ctx := context.Background()
	rdb := s.Client(t)

	setReplicated(t, rdb, "k", "v")
	old := s.Master(t)

	killed := time.Now()
	s.Failover(t)
	t.Logf("failed over %v after the kill", time.Since(killed).Round(time.Millisecond))

	m := s.Master(t)
	if m == old {
		t.Fatalf("Master is still the killed node %s", old.Addr)
	}
	if role, ok := m.Do(t, "ROLE").([]any); !ok || len(role) == 0 || role[0] != "master" {
		t.Errorf("ROLE of the new master = %#v", role)
	}
	eventually(t, 10*time.Second, func() error {
		got, err := rdb.Get(ctx, "k").Result()
		if err == nil && got != "v" {
			err = fmt.Errorf("GET k = %q, want %q", got, "v")
		}
		return err
	})
}
