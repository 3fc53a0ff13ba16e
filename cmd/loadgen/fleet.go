package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/peers"
	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/report"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
)

// node is one member of the simulated fleet: one process's limiter. allow decides one request of the
// configured cost for key number k; now is the time since the run started (monotonic). local reports
// that the decision was made without a Redis round trip on the caller's path.
type node interface {
	allow(ctx context.Context, k int, now time.Duration) (allowed, local bool, err error)
}

// fleet is the nodes of one mode, with what they own.
type fleet struct {
	mode    string
	nodes   []node
	clients []redis.UniversalClient
	hooks   []*cmdHook
	lims    []*hybrid.Limiter
}

// newFleet builds c.nodes nodes of mode, each with its own Redis client when the mode uses Redis.
// names are the key names; runID keeps this run's Redis keys apart from any other's.
func newFleet(mode string, c *config, be *backend, names []string, runID string) (*fleet, error) {
	f := &fleet{mode: mode}
	for i := 0; i < c.nodes; i++ {
		var rdb redis.UniversalClient
		if redisModes[mode] {
			h := newCmdHook()
			rdb = be.newClient(h, mode == "hybrid")
			f.clients = append(f.clients, rdb)
			f.hooks = append(f.hooks, h)
		}
		n, err := f.newNode(mode, c, rdb, names, runID)
		if err != nil {
			_ = f.close(context.Background())
			return nil, err
		}
		f.nodes = append(f.nodes, n)
	}
	return f, nil
}

func (f *fleet) newNode(mode string, c *config, rdb redis.UniversalClient, names []string, runID string) (node, error) {
	switch mode {
	case "hybrid":
		lim, err := hybrid.New(rdb,
			hybrid.WithKeyPrefix("lg"+runID+"h"),
			hybrid.WithSyncInterval(c.syncInterval),
			hybrid.WithDriftThreshold(c.drift),
			hybrid.WithFailurePolicy(c.policy),
			hybrid.WithCheckTimeout(c.syncTimeout),
			hybrid.WithLeaseAdvance(c.leaseAdvance),
			hybrid.WithMaxKeys(c.maxKeys))
		if err != nil {
			return nil, err
		}
		f.lims = append(f.lims, lim)
		return &hybridNode{lim: lim, keys: names, limit: hybrid.Limit{Rate: c.rate, Burst: c.burst}, cost: c.cost}, nil
	case "central":
		s, err := peers.NewStrict(rdb, c.rate, c.burst)
		if err != nil {
			return nil, err
		}
		return &strictNode{s: s, keys: prefixed(names, "lg:"+runID+":c:", true), cost: c.cost}, nil
	case "redisrate":
		return &redisRateNode{rl: redis_rate.NewLimiter(rdb), keys: prefixed(names, "lg:"+runID+":r:", false),
			limit: redisRateLimit(c.rate, c.burst), cost: int(c.cost)}, nil
	case "local":
		return &localNode{l: peers.NewLocal(c.rate, c.burst), keys: names, cost: c.cost}, nil
	case "xrate":
		return &xrateNode{x: peers.NewXRate(c.rate, c.burst), keys: names, cost: c.cost}, nil
	}
	return nil, fmt.Errorf("unknown mode %q", mode)
}

// awaitReady waits, at most within, until every hybrid limiter is Ready (ban list read, fleet
// counted), as a service's readiness check would before it takes traffic: until then a new key's
// first decision goes to Redis (docs/operations.md, "Readiness"). Nodes of a fleet started at once
// are ready within about a second. It says so on stderr, and goes on, if they are not.
func (f *fleet) awaitReady(ctx context.Context, within time.Duration) {
	deadline := time.Now().Add(within)
	for _, l := range f.lims {
		for !l.Ready() {
			if ctx.Err() != nil || time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "loadgen: hybrid nodes not ready after %v; starting anyway (new keys' first decisions go to Redis)\n", within)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// close closes the limiters (flushing hybrid's pending consumption) and then the clients.
func (f *fleet) close(ctx context.Context) error {
	var errs []error
	for _, l := range f.lims {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		errs = append(errs, l.Close(cctx))
		cancel()
	}
	for _, c := range f.clients {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// hybridStats sums the limiters' counters.
func (f *fleet) hybridStats() (report.Sources, report.Sync) {
	var src report.Sources
	var sy report.Sync
	for _, l := range f.lims {
		s := l.Stats()
		src.Local += s.Local
		src.LocalDenied += s.LocalDenied
		src.Central += s.Central
		src.CentralDenied += s.CentralDenied
		src.DenyCache += s.DenyCache
		src.FallbackAllowed += s.FallbackAllowed
		src.FallbackDenied += s.FallbackDenied
		sy.Flushes += s.Flushes
		sy.FlushedKeys += s.FlushedKeys
		sy.FailedKeys += s.FailedKeys
		sy.LibraryCommands += s.RedisCommands
		sy.RedisErrors += s.RedisErrors
		sy.Unrecorded += s.Unrecorded
	}
	return src, sy
}

// prefixed returns names with prefix in front; with tag, each name becomes a hash tag, so that a
// Cluster keeps each key's bucket in one slot.
func prefixed(names []string, prefix string, tag bool) []string {
	out := make([]string, len(names))
	for i, n := range names {
		if tag {
			out[i] = peers.StrictKey(prefix, n)
		} else {
			out[i] = prefix + n
		}
	}
	return out
}

// redisRateLimit expresses rate tokens/s and burst as a redis_rate limit, whose rate is an integer
// count per period: rate/s when rate is whole, else rate·10⁶ per 10⁶ s.
func redisRateLimit(rate float64, burst int64) redis_rate.Limit {
	if rate == math.Trunc(rate) && rate <= math.MaxInt32 {
		return redis_rate.Limit{Rate: int(rate), Burst: int(burst), Period: time.Second}
	}
	return redis_rate.Limit{Rate: int(math.Round(rate * 1e6)), Burst: int(burst), Period: 1e6 * time.Second}
}

type hybridNode struct {
	lim   *hybrid.Limiter
	keys  []string
	limit hybrid.Limit
	cost  int64
}

// allow counts a decision as local when it came from the node's own state: its local allowance (or a
// local denial) or its deny cache.
func (n *hybridNode) allow(ctx context.Context, k int, _ time.Duration) (bool, bool, error) {
	d, err := n.lim.DecideN(ctx, n.keys[k], n.limit, n.cost)
	return d.Allowed, d.Source == outcome.SourceLocal || d.Source == outcome.SourceDenyCache, err
}

type strictNode struct {
	s    *peers.Strict
	keys []string
	cost int64
}

func (n *strictNode) allow(ctx context.Context, k int, _ time.Duration) (bool, bool, error) {
	r, err := n.s.AllowN(ctx, n.keys[k], n.cost)
	return r.Allowed, false, err
}

type redisRateNode struct {
	rl    *redis_rate.Limiter
	keys  []string
	limit redis_rate.Limit
	cost  int
}

func (n *redisRateNode) allow(ctx context.Context, k int, _ time.Duration) (bool, bool, error) {
	r, err := n.rl.AllowN(ctx, n.keys[k], n.limit, n.cost)
	if err != nil {
		return false, false, err
	}
	return r.Allowed > 0, false, nil
}

type localNode struct {
	l    *peers.Local
	keys []string
	cost int64
}

func (n *localNode) allow(_ context.Context, k int, now time.Duration) (bool, bool, error) {
	return n.l.AllowN(n.keys[k], now, n.cost), true, nil
}

type xrateNode struct {
	x    *peers.XRate
	keys []string
	cost int64
}

func (n *xrateNode) allow(_ context.Context, k int, _ time.Duration) (bool, bool, error) {
	return n.x.AllowN(n.keys[k], n.cost), true, nil
}
