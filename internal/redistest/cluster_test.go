package redistest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 6-node Redis Cluster; skipped in -short mode")
	}
	t.Parallel()
	start := time.Now()
	c := StartCluster(t, 3, 1)
	t.Logf("cluster of %d nodes ready in %v", len(c.Nodes()), time.Since(start).Round(time.Millisecond))
	if got, want := len(c.Addrs), 6; got != want {
		t.Fatalf("len(Addrs) = %d, want %d", got, want)
	}
	ctx := context.Background()
	cc := c.Client(t, func(o *redis.ClusterOptions) { o.MaxRedirects = 8 })

	t.Run("a key set through the cluster client is read back", func(t *testing.T) {
		// Replicas count the writes they apply, so count the reads.
		before := c.CommandStats(t)["get"]
		for i := range 10 {
			key := fmt.Sprintf("key-%d", i)
			if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
				t.Fatalf("SET %s: %v", key, err)
			}
			if got, err := cc.Get(ctx, key).Int(); err != nil || got != i {
				t.Fatalf("GET %s = %d, %v; want %d", key, got, err, i)
			}
		}
		if got, want := c.CommandStats(t)["get"]-before, int64(10); got != want {
			t.Errorf("GET calls summed over nodes grew by %d, want %d", got, want)
		}
		if got := c.MasterFor(t, "key-0").Do(t, "GET", "key-0"); got != "0" {
			t.Errorf("GET key-0 on MasterFor(key-0) = %#v, want \"0\"", got)
		}
	})

	t.Run("a killed master is replaced by its replica", func(t *testing.T) {
		const key = "failover"
		old := c.MasterFor(t, key)
		setReplicated(t, old.Client(t), key, "v")

		killed := time.Now()
		old.Kill(t)
		c.WaitHealthy(t, 15*time.Second)
		t.Logf("healthy again %v after the kill", time.Since(killed).Round(time.Millisecond))

		if m := c.MasterFor(t, key); m == old {
			t.Fatalf("MasterFor(%q) is still the killed node %s", key, old.Addr)
		}
		// go-redis keeps sending to the dead master until its slot map is
		// reloaded: by a MOVED reply, or every ClusterStateReloadInterval
		// (60s by default). A refused dial triggers neither.
		cc.ReloadState(ctx)
		eventually(t, 10*time.Second, func() error {
			got, err := cc.Get(ctx, key).Result()
			if err == nil && got != "v" {
				err = fmt.Errorf("GET %s = %q, want %q", key, got, "v")
			}
			return err
		})

		t.Run("and rejoins as a replica when restarted", func(t *testing.T) {
			old.Restart(t)
			eventually(t, 15*time.Second, func() error {
				role, ok := old.Do(t, "ROLE").([]any)
				if !ok || len(role) == 0 || role[0] != "slave" {
					return fmt.Errorf("ROLE of the restarted node = %v", role)
				}
				return nil
			})
			c.WaitHealthy(t, 15*time.Second)
		})
	})
}

// setReplicated sets key to value and waits until a replica has the write.
// WAIT must follow the write on the same connection, hence the pipeline.
func setReplicated(t *testing.T, rdb *redis.Client, key, value string) {
	t.Helper()
	ctx := context.Background()
	pipe := rdb.Pipeline()
	pipe.Set(ctx, key, value, 0)
	wait := pipe.Do(ctx, "WAIT", 1, 5000)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("SET %s + WAIT: %v", key, err)
	}
	if got, err := wait.Int64(); err != nil || got != 1 {
		t.Fatalf("WAIT 1 = %d, %v; want the write on 1 replica", got, err)
	}
}
