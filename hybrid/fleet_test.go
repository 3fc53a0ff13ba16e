package hybrid_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
)

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

func consumedInRedis(t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	return consumedByKey(t, rdb, hybrid.DefaultKeyPrefix)[key]
}

func startRedis(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	return srv, srv.Client(t)
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}
