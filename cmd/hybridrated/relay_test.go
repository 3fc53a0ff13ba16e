package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// TestRelayMode: one sidecar serves as a relay (-relay), another takes its hybrid rules' leases
// from it (-upstream): the limit holds through the relay, and Redis's buckets hold the relay's
// record, not the other sidecar's.
func TestRelayMode(t *testing.T) {
	srv := redistest.Start(t)
	path := perKeyPolicy(t, 5)
	ra, stopA := start(t, config{redisAddr: srv.Addr, policyPath: path, relay: true})
	rb, stopB := start(t, config{redisAddr: srv.Addr, policyPath: path, upstream: "http://" + ra.http,
		checkTimeout: 200 * time.Millisecond})
	got := admitted(t, "http://"+rb.http, "through-relay", 20)
	t.Logf("admitted %d of 20 through the relay", got)
	// A burst of 5 at 0.01/s: the relay hands the sidecar its leases from the bucket; a cold-start
	// credit of at most 2 tokens (two limiters in the fleet) may come on top.
	if got < 5 || got > 7 {
		t.Errorf("admitted %d of 20 through the relay, want 5 to 7", got)
	}
	require.NoError(t, stopB())
	require.NoError(t, stopA())
	buckets := bucketRecords(t, srv)
	require.NotEmpty(t, buckets, "the bucket is in Redis")
	for k, nodes := range buckets {
		for _, n := range nodes {
			if !strings.HasPrefix(n, "relay-") {
				t.Errorf("bucket %q holds the record of %q: the sidecar behind the relay reached Redis itself", k, n)
			}
		}
	}
	ctx := context.Background()
	_, err := parseConfig([]string{"-upstream", "ftp://x"}, func(string) string { return "" }, io.Discard)
	require.NoError(t, err) // the URL is checked when the sidecar starts
	ec := make(chan error, 1)
	go func() {
		ec <- run(ctx, config{redisAddr: srv.Addr, policyPath: path, upstream: "ftp://x", grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0"}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	}()
	select {
	case err := <-ec:
		require.ErrorContains(t, err, "-upstream")
	case <-time.After(10 * time.Second):
		t.Fatal("a bad -upstream did not stop the start")
	}
}

// TestShardedUpstream: a sidecar given two relays (-upstream URL1,URL2) sends each key to one of
// them: every bucket in Redis holds one relay's record and no sidecar's, and the keys are spread
// over both relays; the limit holds per key.
func TestShardedUpstream(t *testing.T) {
	srv := redistest.Start(t)
	path := perKeyPolicy(t, 3)
	ra, stopA := start(t, config{redisAddr: srv.Addr, policyPath: path, relay: true, relayOwner: true})
	rb, stopB := start(t, config{redisAddr: srv.Addr, policyPath: path, relay: true, relayOwner: true})
	rc, stopC := start(t, config{redisAddr: srv.Addr, policyPath: path,
		upstream: "http://" + ra.http + ", http://" + rb.http + "/", checkTimeout: 200 * time.Millisecond})
	for i := range 12 {
		key := fmt.Sprintf("user-%d", i)
		// A burst of 3 at 0.01/s; a cold-start credit of at most 1 token may come on top (three
		// limiters in the fleet).
		if got := admitted(t, "http://"+rc.http, key, 8); got < 3 || got > 4 {
			t.Errorf("key %s: admitted %d of 8, want 3 or 4", key, got)
		}
	}
	require.NoError(t, stopC())
	require.NoError(t, stopB())
	require.NoError(t, stopA())
	buckets := bucketRecords(t, srv)
	require.Len(t, buckets, 12, "one bucket per key")
	owners := map[string]int{}
	for k, nodes := range buckets {
		if len(nodes) != 1 || !strings.HasPrefix(nodes[0], "relay-") {
			t.Errorf("bucket %q holds the records of %v, want one relay's", k, nodes)
			continue
		}
		owners[nodes[0]]++
	}
	if len(owners) != 2 {
		t.Errorf("keys per relay: %v, want both relays to own some", owners)
	}
	_, err := parseConfig([]string{"-upstream", "http://a:1,http://a:1"}, func(string) string { return "" }, io.Discard)
	require.NoError(t, err) // the URLs are checked when the sidecar starts
	_, err = parseConfig([]string{"-relay-owner"}, func(string) string { return "" }, io.Discard)
	require.ErrorContains(t, err, "-relay-owner needs -relay")
}

// perKeyPolicy writes a policy of one hybrid rule, per api_key at 0.01/s with burst, in a temporary
// directory, and returns its path.
func perKeyPolicy(t *testing.T, burst int) string {
	t.Helper()
	return writePolicy(t, t.TempDir(), fmt.Sprintf(`
version: 1
domain: api
missing_key: skip
rules:
  - id: per-key
    dimensions: [api_key]
    rate: 0.01
    burst: %d
`, burst))
}

// bucketRecords returns, for each hybrid bucket in srv's Redis, the nodes whose records it holds.
func bucketRecords(t *testing.T, srv *redistest.Server) map[string][]string {
	t.Helper()
	rdb := srv.Client(t)
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*:b:*").Result()
	require.NoError(t, err)
	out := make(map[string][]string, len(keys))
	for _, k := range keys {
		fields, err := rdb.HKeys(ctx, k).Result()
		require.NoError(t, err)
		nodes := []string{}
		for _, f := range fields {
			if n, ok := strings.CutPrefix(f, "n:"); ok {
				nodes = append(nodes, n)
			} else if central.IsNodeField(f) {
				nodes = append(nodes, hex.EncodeToString([]byte(f[1:])))
			}
		}
		out[k] = nodes
	}
	return out
}
