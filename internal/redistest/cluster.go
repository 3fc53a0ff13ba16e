package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterSlots is the number of hash slots in a Redis Cluster.
	clusterSlots = 16384
	// clusterCreateTimeout bounds redis-cli --cluster create.
	clusterCreateTimeout = 60 * time.Second
	// clusterReadyTimeout bounds the wait for a new cluster to settle.
	clusterReadyTimeout = 30 * time.Second
)

// Cluster is a Redis Cluster of redis-server processes started by
// [StartCluster]. Its nodes are killed in the cleanup of the test that
// started it.
//
// Most callers want [Cluster.Client]. To inject failures, pick a node with
// [Cluster.MasterFor] or [Cluster.Nodes] and use [Server.Kill],
// [Server.Pause] or [Server.Restart], then [Cluster.WaitHealthy].
//
// The zero Cluster is not usable. A Cluster is safe for concurrent use, but
// its methods fail the test through tb, so call them from the test's
// goroutine.
type Cluster struct {
	// Addrs holds the addresses of all nodes, masters and replicas, in the
	// order given to redis-cli --cluster create.
	Addrs []string

	nodes []*Server
}

// StartCluster starts a Redis Cluster of masters masters with
// replicasPerMaster replicas each (masters must be at least 3) and returns
// once it is ready.
//
// Each node runs with no persistence, cluster-node-timeout 1000 (ms), so a
// dead master is detected and replaced within a few seconds, and
// cluster-replica-validity-factor 0, so a replica may always take over. The
// slots are assigned by redis-cli --cluster create, which StartCluster runs
// (redis-cli must be in PATH, like redis-server for [Binary]).
//
// Ready means that every node reports cluster_state:ok with all 16384 slots
// covered, knows every other node, agrees with the others on which master
// serves each slot, and, for replicas, has its link to its master up.
func StartCluster(tb testing.TB, masters, replicasPerMaster int) *Cluster {
	tb.Helper()
	if masters < 3 {
		tb.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	if replicasPerMaster < 0 {
		tb.Fatalf("redistest: negative replicasPerMaster %d", replicasPerMaster)
	}
	Binary(tb)
	cli := lookTool(tb, "redis-cli", "redis-tools")

	c := &Cluster{}
	for range masters * (1 + replicasPerMaster) {
		s := newServer(tb, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000",
			"--cluster-replica-validity-factor", "0",
		})
		s.cluster = true
		s.startFresh(tb)
		c.nodes = append(c.nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}

	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitFor(clusterReadyTimeout, true); err != nil {
		tb.Fatalf("redistest: cluster not ready: %v\nredis-cli output:\n%s", err, out)
	}
	return c
}

// Client returns a go-redis cluster client seeded with all node addresses,
// before opt are applied. The client is closed in tb.Cleanup.
//
// After a master dies, go-redis keeps sending its slots' commands to it
// (failing with "connection refused") until it reloads its slot map, which
// a MOVED reply triggers but a refused dial does not; otherwise that only
// happens every ClusterStateReloadInterval (60s by default). Tests that kill
// a master call ReloadState on the client after [Cluster.WaitHealthy], or
// set a shorter interval in opt.
func (c *Cluster) Client(tb testing.TB, opt ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	tb.Helper()
	o := &redis.ClusterOptions{Addrs: slices.Clone(c.Addrs)}
	for _, f := range opt {
		f(o)
	}
	cc := redis.NewClusterClient(o)
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Nodes returns every node, masters and replicas, in the order of Addrs.
// Roles change on failover; use [Cluster.MasterFor] to find a master.
func (c *Cluster) Nodes() []*Server {
	return slices.Clone(c.nodes)
}

// MasterFor returns the node currently serving key's hash slot, according
// to CLUSTER KEYSLOT and CLUSTER SLOTS on a live node. Nodes whose view
// names a dead master are skipped in favour of the next node's view.
func (c *Cluster) MasterFor(tb testing.TB, key string) *Server {
	tb.Helper()
	var errs []error
	for _, s := range c.liveNodes() {
		m, err := c.masterFor(s, key)
		if err == nil {
			return m
		}
		errs = append(errs, fmt.Errorf("%s: %w", s.Addr, err))
	}
	tb.Fatalf("redistest: no live master for key %q: %v", key, errors.Join(errs...))
	return nil
}

func (c *Cluster) masterFor(s *Server, key string) (*Server, error) {
	ctx := context.Background()
	v, err := s.command(ctx, "CLUSTER", "KEYSLOT", key)
	if err != nil {
		return nil, err
	}
	slot, ok := v.(int64)
	if !ok {
		return nil, fmt.Errorf("CLUSTER KEYSLOT: unexpected reply %#v", v)
	}
	ranges, err := clusterSlotRanges(ctx, s)
	if err != nil {
		return nil, err
	}
	for _, r := range ranges {
		if r.start <= slot && slot <= r.end {
			m := c.nodeByPort(r.port)
			if m == nil || !m.live() {
				return nil, fmt.Errorf("slot %d is served by %d, which is not live", slot, r.port)
			}
			return m, nil
		}
	}
	return nil, fmt.Errorf("slot %d is not covered", slot)
}

// WaitHealthy waits until every live node (running and not paused) reports
// cluster_state:ok with all slots covered, and all live nodes agree that
// each slot is served by a live master. It fails the test after timeout.
//
// Right after a master is killed, the nodes have not noticed yet and still
// report cluster_state:ok; the harness knows which processes it killed or
// paused, so WaitHealthy keeps waiting until a live node serves the dead master's
// slots.
func (c *Cluster) WaitHealthy(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	if err := c.waitFor(timeout, false); err != nil {
		tb.Fatalf("redistest: cluster not healthy after %v: %v", timeout, err)
	}
}

// CommandStats returns [Server.CommandStats] summed over the live nodes.
//
// Replicas count the writes they apply from their master, so a SET counts
// once per copy. Scripts are replicated as their effects, so "eval" and
// "evalsha" count only the calls clients made.
func (c *Cluster) CommandStats(tb testing.TB) map[string]int64 {
	tb.Helper()
	sum := make(map[string]int64)
	for _, s := range c.liveNodes() {
		for name, n := range s.CommandStats(tb) {
			sum[name] += n
		}
	}
	return sum
}

// waitFor polls check until it passes or timeout expires.
func (c *Cluster) waitFor(timeout time.Duration, startup bool) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.check(startup)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(pollInterval)
	}
}

// check returns nil if the live nodes agree on a healthy cluster. At
// startup it also requires every node to know all the others and every
// replica to be linked to its master.
func (c *Cluster) check(startup bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	live := c.liveNodes()
	if len(live) == 0 {
		return errors.New("no live node")
	}
	var first string
	for _, s := range live {
		v, err := s.command(ctx, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", s.Addr, err)
		}
		info, _ := v.(string)
		if st := infoField(info, "cluster_state"); st != "ok" {
			return fmt.Errorf("%s: cluster_state:%s", s.Addr, st)
		}
		if ok := infoField(info, "cluster_slots_ok"); ok != strconv.Itoa(clusterSlots) {
			return fmt.Errorf("%s: cluster_slots_ok:%s", s.Addr, ok)
		}
		ranges, err := clusterSlotRanges(ctx, s)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Addr, err)
		}
		var covered int64
		var view strings.Builder
		for _, r := range ranges {
			if m := c.nodeByPort(r.port); m == nil || !m.live() {
				return fmt.Errorf("%s: slots %d-%d are served by %d, which is not live", s.Addr, r.start, r.end, r.port)
			}
			covered += r.end - r.start + 1
			fmt.Fprintf(&view, "%d-%d:%d ", r.start, r.end, r.port)
		}
		if covered != clusterSlots {
			return fmt.Errorf("%s: CLUSTER SLOTS covers %d slots", s.Addr, covered)
		}
		if first == "" {
			first = view.String()
		} else if view.String() != first {
			return fmt.Errorf("nodes disagree on slots: %s vs %s", first, view.String())
		}
		if !startup {
			continue
		}
		if n := infoField(info, "cluster_known_nodes"); n != strconv.Itoa(len(c.nodes)) {
			return fmt.Errorf("%s: cluster_known_nodes:%s, want %d", s.Addr, n, len(c.nodes))
		}
		v, err = s.command(ctx, "INFO", "replication")
		if err != nil {
			return fmt.Errorf("%s: INFO replication: %w", s.Addr, err)
		}
		repl, _ := v.(string)
		if infoField(repl, "role") == "slave" && infoField(repl, "master_link_status") != "up" {
			return fmt.Errorf("%s: replica link to master is %s", s.Addr, infoField(repl, "master_link_status"))
		}
	}
	return nil
}

func (c *Cluster) liveNodes() []*Server {
	var live []*Server
	for _, s := range c.nodes {
		if s.live() {
			live = append(live, s)
		}
	}
	return live
}

func (c *Cluster) nodeByPort(port int) *Server {
	for _, s := range c.nodes {
		if s.Port == port {
			return s
		}
	}
	return nil
}

// slotRange is one entry of CLUSTER SLOTS: slots start..end (inclusive)
// served by the master on port.
type slotRange struct {
	start, end int64
	port       int
}

// clusterSlotRanges runs CLUSTER SLOTS on s and returns its ranges sorted by
// start.
func clusterSlotRanges(ctx context.Context, s *Server) ([]slotRange, error) {
	v, err := s.command(ctx, "CLUSTER", "SLOTS")
	if err != nil {
		return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	entries, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("CLUSTER SLOTS: unexpected reply %#v", v)
	}
	ranges := make([]slotRange, 0, len(entries))
	for _, e := range entries {
		// [start, end, [ip, port, id, ...], replicas...]
		f, ok := e.([]any)
		if !ok || len(f) < 3 {
			return nil, fmt.Errorf("CLUSTER SLOTS: unexpected entry %#v", e)
		}
		start, ok1 := f[0].(int64)
		end, ok2 := f[1].(int64)
		master, ok3 := f[2].([]any)
		if !ok1 || !ok2 || !ok3 || len(master) < 2 {
			return nil, fmt.Errorf("CLUSTER SLOTS: unexpected entry %#v", e)
		}
		port, ok := master[1].(int64)
		if !ok {
			return nil, fmt.Errorf("CLUSTER SLOTS: unexpected master %#v", master)
		}
		ranges = append(ranges, slotRange{start: start, end: end, port: int(port)})
	}
	slices.SortFunc(ranges, func(a, b slotRange) int { return int(a.start - b.start) })
	return ranges, nil
}

// AwaitDialRetries waits, for up to 3s, until no go-redis connection pool is retrying a dial: after
// a dial fails, a pool probes its server once a second from a goroutine that exits only when the
// server answers or the client is closed, so after a master was killed for good that goroutine
// outlives the test by up to a second, and goleak (a TestMain) would report it. Register it as the
// test's first cleanup, so that it runs after the cleanups that close the clients.
func AwaitDialRetries(tb testing.TB) {
	tb.Helper()
	buf := make([]byte, 8<<20)
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if n := runtime.Stack(buf, true); !bytes.Contains(buf[:n], []byte("pool.(*ConnPool).tryDial")) {
			return
		}
	}
	tb.Logf("a go-redis dial retry is still running after 3s")
}

// StartFailoverCluster is the frame of a test that fails a master over: it skips the test under
// -short, marks it parallel, registers AwaitDialRetries as its first cleanup (so that it runs after
// the clients are closed) and returns a Redis Cluster of 3 masters with a replica each.
func StartFailoverCluster(t *testing.T) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a 6-node Redis Cluster and fails a master over; run without -short")
	}
	t.Parallel()
	t.Cleanup(func() { AwaitDialRetries(t) })
	return StartCluster(t, 3, 1)
}

// ClusterSetup is a cluster client set-up a test runs under: Opt adjusts the client's options.
type ClusterSetup struct {
	Name string
	Opt  func(*redis.ClusterOptions)
}

// ClusterClientSetups are the set-ups under which a hung-server test checks that a limiter bounds
// its calls whatever the client's options: go-redis's defaults (ReadTimeout 5s), no read timeout at
// all, and ContextTimeoutEnabled.
var ClusterClientSetups = []ClusterSetup{
	{"defaults", func(*redis.ClusterOptions) {}},
	{"no read timeout", func(o *redis.ClusterOptions) { o.ReadTimeout = -1 }},
	{"context timeouts", func(o *redis.ClusterOptions) { o.ContextTimeoutEnabled = true }},
}

// ClusterRun is what [ForEachClusterSetup] hands each run: the shared cluster, a client made with
// one of [ClusterClientSetups] (closed in the subtest's cleanup), and that set-up's name.
type ClusterRun struct {
	Cluster *Cluster
	Client  *redis.ClusterClient
	Name    string
}

// ForEachClusterSetup is the frame of a hung-cluster test: it skips the test under -short, marks
// it parallel, starts a Redis Cluster of 3 masters without replicas, and runs fn once per entry of
// [ClusterClientSetups], one at a time (they share the cluster), each in a subtest named after the
// set-up.
func ForEachClusterSetup(t *testing.T, fn func(t *testing.T, run ClusterRun)) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	cl := StartCluster(t, 3, 0)
	for _, tc := range ClusterClientSetups {
		t.Run(tc.Name, func(t *testing.T) { fn(t, ClusterRun{Cluster: cl, Client: cl.Client(t, tc.Opt), Name: tc.Name}) })
	}
}
