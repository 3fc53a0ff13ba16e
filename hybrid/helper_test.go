package hybrid_test

// Helpers shared by the package's tests: limiters over a real Redis, what Redis counted, load, and
// the fleet of limiters (with its workloads and overshoot bounds) of the accuracy tests.

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

// newLimiter returns a limiter over rdb that is closed (with a final flush) in t.Cleanup. Register
// rdb's own cleanup first, so that the limiter is closed before its client.
func newLimiter(t *testing.T, rdb redis.UniversalClient, opts ...hybrid.Option) *hybrid.Limiter {
	t.Helper()
	lim, err := hybrid.New(rdb, opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = lim.Close(ctx)
	})
	return lim
}

// awaitBans waits until lim has read the ban list, from when it grants new keys cold-start credit.
func awaitBans(t testing.TB, lim *hybrid.Limiter) {
	t.Helper()
	require.Eventually(t, lim.Ready, 5*time.Second, time.Millisecond, "the ban list is read and the fleet counted")
}

// flushed flushes lim until nothing is pending (a breaker may need a cooldown after an outage).
func flushed(t *testing.T, lim *hybrid.Limiter, within time.Duration) {
	t.Helper()
	var last error
	ok := assert.Eventually(t, func() bool {
		last = lim.Flush(context.Background())
		return last == nil && lim.Stats().Pending == 0
	}, within, 20*time.Millisecond)
	if !ok {
		t.Fatalf("pending consumption not flushed within %v: last error %v, stats %+v", within, last, lim.Stats())
	}
}

// consumed returns the 'c' field (tokens consumed in total) of the bucket of each key, under the
// default prefix; a missing bucket counts 0. It works on every kind of client (pipelines are split
// per node by a cluster client).
// bucketConsumed returns c, the tokens admitted in total, from a bucket's packed "b" field
// (lua/reconcile.lua: "t:s:c:w:nt:x").
func bucketConsumed(b string) (int64, error) {
	st, err := central.ParseBucket(b)
	return st.Consumed, err
}

func consumed(t *testing.T, rdb redis.UniversalClient, keys []string) []int64 {
	t.Helper()
	all := consumedByKey(t, rdb, hybrid.DefaultKeyPrefix)
	out := make([]int64, len(keys))
	for i, k := range keys {
		out[i] = all[k]
	}
	return out
}

// consumedByKey reads Redis's accounting (c, the third element of the packed "b" field) of every bucket under prefix, summed per limiter key
// over the limits it was used with. It scans every master of a cluster.
func consumedByKey(t *testing.T, rdb redis.UniversalClient, prefix string) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	out := map[string]int64{}
	var mu sync.Mutex
	head := prefix + ":" + central.Version + ":b:{"
	scan := func(ctx context.Context, c *redis.Client) error {
		var names []string
		iter := c.Scan(ctx, 0, head+"*", 1000).Iterator()
		for iter.Next(ctx) {
			names = append(names, iter.Val())
		}
		if err := iter.Err(); err != nil {
			return err
		}
		for lo := 0; lo < len(names); lo += 1000 {
			hi := min(lo+1000, len(names))
			pipe := c.Pipeline()
			cmds := make([]*redis.StringCmd, hi-lo)
			for i := lo; i < hi; i++ {
				cmds[i-lo] = pipe.HGet(ctx, names[i], "b")
			}
			_, _ = pipe.Exec(ctx)
			for i, cmd := range cmds {
				b, err := cmd.Result()
				if err == redis.Nil || redis.HasErrorPrefix(err, "WRONGTYPE") { // not a bucket (a test's poisoned key)
					continue
				}
				if err != nil {
					return err
				}
				v, err := bucketConsumed(b)
				if err != nil {
					return err
				}
				name := names[lo+i]
				// "<head><key>}": the key is what lies before the last "}".
				rest := name[len(head):]
				k := rest[:len(rest)-1]
				mu.Lock()
				out[k] += v
				mu.Unlock()
			}
		}
		return nil
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		require.NoError(t, c.ForEachMaster(ctx, scan))
	case *redis.Client:
		require.NoError(t, scan(ctx, c))
	default:
		t.Fatalf("consumedByKey: unsupported client %T", rdb)
	}
	return out
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

// loader drives Allow calls on keys from several goroutines until stop, and counts what it saw.
type loader struct {
	lim   *hybrid.Limiter
	keys  []string
	limit hybrid.Limit
	// pace is the pause after each call of one goroutine; zero runs flat out.
	pace time.Duration
	// observe, if set, sees every decision (it must be safe for concurrent use).
	observe func(key int, d hybrid.Decision, err error, latency time.Duration)

	admitted []atomic.Int64 // per key
	calls    atomic.Int64
	errs     atomic.Int64
	sources  [5]atomic.Int64 // by outcome.Source
	errMu    sync.Mutex
	errSeen  []string // distinct error messages (at most 10)
	stop     chan struct{}
	wg       sync.WaitGroup
}

func (l *loader) start(goroutines int) {
	l.admitted = make([]atomic.Int64, len(l.keys))
	l.stop = make(chan struct{})
	for g := range goroutines {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			ctx := context.Background()
			for i := g; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				k := i % len(l.keys)
				t0 := time.Now()
				d, err := l.lim.Decide(ctx, l.keys[k], l.limit)
				lat := time.Since(t0)
				l.calls.Add(1)
				if err != nil {
					l.errs.Add(1)
					l.errMu.Lock()
					if len(l.errSeen) < 10 && !slices.Contains(l.errSeen, err.Error()) {
						l.errSeen = append(l.errSeen, err.Error())
					}
					l.errMu.Unlock()
				} else {
					l.sources[d.Source].Add(1)
					if d.Allowed {
						l.admitted[k].Add(1)
					}
				}
				if l.observe != nil {
					l.observe(k, d, err, lat)
				}
				if l.pace > 0 {
					time.Sleep(l.pace)
				}
			}
		}()
	}
}

// halt stops the goroutines and waits for them.
func (l *loader) halt() {
	close(l.stop)
	l.wg.Wait()
}

func (l *loader) total() int64 {
	var s int64
	for i := range l.admitted {
		s += l.admitted[i].Load()
	}
	return s
}

func (l *loader) String() string {
	return fmt.Sprintf("calls=%d errors=%d local=%d central=%d deny-cache=%d fallback=%d admitted=%d",
		l.calls.Load(), l.errs.Load(), l.sources[outcome.SourceLocal].Load(), l.sources[outcome.SourceCentral].Load(),
		l.sources[outcome.SourceDenyCache].Load(), l.sources[outcome.SourceFallback].Load(), l.total())
}

func (l *loader) errors() []string {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	return slices.Clone(l.errSeen)
}

func keyNames(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// percentile returns the p-quantile (0 to 1) of ds, which it sorts.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(int(p*float64(len(ds))), len(ds)-1)]
}

// heapInUse returns the live heap after a GC.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// warm decides on each key until a decision is local: the first goes to Redis and brings the key a
// local allowance.
func warm(t *testing.T, lim *hybrid.Limiter, keys []string, limit hybrid.Limit) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		require.Eventually(t, func() bool {
			d, err := lim.Decide(ctx, k, limit)
			require.NoError(t, err)
			return d.Allowed && d.Source == outcome.SourceLocal
		}, 5*time.Second, time.Millisecond, "key %s gets a local allowance", k)
	}
}

// allowLocally asks lim n times for each of keys under limit, requiring each decision to be made
// locally (from the keys' allowances, see warm).
func allowLocally(t *testing.T, lim *hybrid.Limiter, keys []string, limit hybrid.Limit, n int) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		for range n {
			d, err := lim.Decide(ctx, k, limit)
			require.NoError(t, err)
			require.Equal(t, outcome.SourceLocal, d.Source, "key %s", k)
		}
	}
}

func startRedis(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	return srv, srv.Client(t)
}

func consumedInRedis(t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	return consumedByKey(t, rdb, hybrid.DefaultKeyPrefix)[key]
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// bucketKey is the Redis key of key's bucket under the default key prefix.
func bucketKey(key string) string { return central.BucketKey(hybrid.DefaultKeyPrefix, key) }

// bucketKeys is the start of the Redis keys of the buckets of the keys that start with keyPrefix,
// under the default key prefix: a SCAN pattern with "*" appended, or a prefix to check.
func bucketKeys(keyPrefix string) string { return strings.TrimSuffix(bucketKey(keyPrefix), "}") }

// fleet is N limiters ("nodes"), each with its own Redis client, as N processes would have.
type fleet struct {
	lims []*hybrid.Limiter
}

func newFleet(t *testing.T, addr string, n int, opts ...hybrid.Option) *fleet {
	t.Helper()
	f := &fleet{}
	for range n {
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		lim, err := hybrid.New(rdb, opts...)
		require.NoError(t, err)
		f.lims = append(f.lims, lim)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = lim.Close(ctx)
			_ = rdb.Close()
		})
	}
	return f
}

// flush flushes every node until nothing is pending (the breaker may need a moment after an outage).
func (f *fleet) flush(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		ok := true
		for _, l := range f.lims {
			if l.Flush(context.Background()) != nil || l.Stats().Pending > 0 {
				ok = false
			}
		}
		return ok
	}, 10*time.Second, 50*time.Millisecond, "pending consumption could not be flushed")
}

// workload drives keys at demand tokens/s each (spread evenly over the nodes, or with affinity)
// until stop is closed.
type workload struct {
	keys     []string
	limit    hybrid.Limit
	demand   float64 // requests per second per key, over all nodes
	affinity float64 // when > 0, this share of a key's requests goes to its home node (key index mod nodes)
	// stagger offsets each node's requests for a key by a fraction of its interval between them
	// (node i of n: (i+j)/n for key j), as a load balancer's round robin would: without it, nodes
	// that each see a key less than once a second all send their requests for it at the same moment.
	stagger bool
}

// share returns the part of key j's demand that node i of n sends.
func (w workload) share(j, i, n int) float64 {
	if w.affinity <= 0 || n == 1 {
		return 1 / float64(n)
	}
	if j%n == i {
		return w.affinity
	}
	return (1 - w.affinity) / float64(n-1)
}

// phase returns node i's offset, in requests, for key j (see stagger).
func (w workload) phase(j, i, n int) float64 {
	if !w.stagger {
		return 0
	}
	return float64((i+j)%n) / float64(n)
}

// tally is what a load run observed.
type tally struct {
	mu         sync.Mutex
	admitted   map[string]int64
	demanded   map[string]int64
	sources    map[outcome.Source]int64
	keySources map[string]map[outcome.Source]int64 // sources by key
	errors     int64
	maxLatency time.Duration
	start, end time.Time
}

// assertCounted checks that Redis counted every token the fleet admitted on key k (got, from
// consumedByKey) and at most cost more per decision on k that the failure policy made: a call whose
// answer was lost (a check timeout on a loaded machine) may still have run in Redis, and a one-off
// take is not idempotent, so its tokens are counted though the caller got the failure policy's
// answer. An over-count, never an under-count (docs/accuracy.md, "Assumptions").
func assertCounted(t *testing.T, tl *tally, k string, got, cost int64) {
	t.Helper()
	adm := tl.admitted[k]
	assert.GreaterOrEqual(t, got, adm, "%s: Redis counts every admitted token", k)
	lost := tl.keySources[k][outcome.SourceFallback]
	assert.LessOrEqual(t, got, adm+cost*lost, "%s: Redis counts at most the tokens of the %d decisions whose answer may have been lost beyond those admitted", k, lost)
}

func newTally() *tally {
	return &tally{admitted: map[string]int64{}, demanded: map[string]int64{}, sources: map[outcome.Source]int64{},
		keySources: map[string]map[outcome.Source]int64{}}
}

// addLocked adds o's counts (admitted, demanded, sources by key and in all, errors) to tl's; the
// caller holds tl.mu, and o is no longer written.
func (tl *tally) addLocked(o *tally) {
	for k, v := range o.admitted {
		tl.admitted[k] += v
	}
	for k, v := range o.demanded {
		tl.demanded[k] += v
	}
	for s, v := range o.sources {
		tl.sources[s] += v
	}
	for k, m := range o.keySources {
		if tl.keySources[k] == nil {
			tl.keySources[k] = map[outcome.Source]int64{}
		}
		for s, v := range m {
			tl.keySources[k][s] += v
		}
	}
	tl.errors += o.errors
}

// run drives the workloads on every node until stop is closed. Each node has one goroutine that, every
// 2ms, issues the requests that are due for each key (see the virtual clock below).
func (f *fleet) run(t *testing.T, stop <-chan struct{}, tl *tally, ws ...workload) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	tl.start = time.Now()
	n := len(f.lims)
	for node, lim := range f.lims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			issued := make([][]int64, len(ws))
			for i, w := range ws {
				issued[i] = make([]int64, len(w.keys))
			}
			local := newTally()
			var maxLat time.Duration
			const period = 2 * time.Millisecond
			tick := time.NewTicker(period)
			defer tick.Stop()
			// Demand follows a virtual clock that advances at most two periods per tick: a goroutine
			// that the scheduler stalled (a loaded CI machine) does not catch up in a burst, so the
			// offered load never exceeds its nominal rate over any window, and "honest" stays honest.
			var virtual time.Duration
			last := time.Now()
			for {
				select {
				case <-stop:
					tl.mu.Lock()
					tl.addLocked(local)
					tl.maxLatency = max(tl.maxLatency, maxLat)
					tl.mu.Unlock()
					return
				case <-tick.C:
				}
				now := time.Now()
				virtual += min(now.Sub(last), 2*period)
				last = now
				el := virtual.Seconds()
				for i, w := range ws {
					for j, key := range w.keys {
						due := int64(w.demand*w.share(j, node, n)*el+w.phase(j, node, n)) - issued[i][j]
						for range due {
							t0 := time.Now()
							d, err := lim.Decide(ctx, key, w.limit)
							lat := time.Since(t0)
							maxLat = max(maxLat, lat)
							issued[i][j]++
							local.demanded[key]++
							if err != nil {
								local.errors++
								continue
							}
							local.sources[d.Source]++
							if local.keySources[key] == nil {
								local.keySources[key] = map[outcome.Source]int64{}
							}
							local.keySources[key][d.Source]++
							if d.Allowed {
								local.admitted[key]++
							}
						}
					}
				}
			}
		}()
	}
	return &wg
}

// harmonic returns H(n) = 1 + 1/2 + … + 1/n.
func harmonic(n int) float64 {
	h := 0.0
	for i := 1; i <= n; i++ {
		h += 1 / float64(i)
	}
	return h
}

// overshootBound is docs/accuracy.md's bound on E for nodes nodes at the default lease life and advance:
//
//	E = min(C·H(N) + min(N, C) + A, C + Rate·L) + min(C, N·max(1, D·Burst)) + min(Burst, N·min(Burst, max(2, D·Burst)))
//	A = Rate·LeaseAdvance, C = Burst + A
//
// unused leases held while the bucket refills, the nodes' overdraft credits (one lendable amount
// over the fleet at most), and their cold-start credits (one burst over the fleet at most).
func overshootBound(drift float64, l hybrid.Limit, nodes int) float64 {
	return overshootBoundAdvance(drift, l, nodes, hybrid.LeaseAdvance)
}

// overshootBoundAdvance is overshootBound for nodes that lend refill ahead (WithLeaseAdvance(advance)).
func overshootBoundAdvance(drift float64, l hybrid.Limit, nodes int, advance time.Duration) float64 {
	b, n := float64(l.Burst), float64(nodes)
	adv := l.Rate * advance.Seconds()
	c := b + adv
	leases := min(c*harmonic(nodes)+min(n, c)+adv, c+l.Rate*hybrid.LeaseLife.Seconds())
	credit := min(c, n*max(1, drift*b))
	cold := min(b, n*min(b, max(2, drift*b)))
	return leases + credit + cold
}
