package sync

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/local"
)

// port is the part of *central.Client the syncer uses.
type port interface {
	Reconcile(ctx context.Context, updates []central.Update, out []central.State, errs []error) error
}

var _ port = (*central.Client)(nil)

// Config configures a [Syncer]. Every field is required unless it says otherwise.
type Config struct {
	// Store is the local state to reconcile.
	Store *local.Store
	// Central sends the batches; *central.Client satisfies it.
	Central port
	// Interval is how often due keys are reconciled, and the unit of the prefetch margin: a key asks
	// for a new lease when what is left of it would last less than three intervals.
	Interval time.Duration
	// MaxBatch is the largest number of keys handed to Central in one call.
	MaxBatch int
	// Drift sizes the overdraft credit each answer grants beyond the lease: max(1, Drift·G/A) tokens
	// when the global bucket G holds at least one token (A active nodes), else none; 0 to 1. Zero
	// means no credit and no lease: every decision goes to Redis.
	Drift float64
	// Horizon is how long a lease should last at the node's demand on the key (its size is demand ×
	// Horizon, within the node's demand-weighted share of the burst).
	Horizon time.Duration
	// Advance is central's lease advance (optional, 0 by default): the overdraft credits of all
	// nodes add up to Burst + Rate·Advance at most (Credit).
	Advance time.Duration
	// Fleet, if not nil, returns the number of live nodes (the fleet registry's count, 0 when
	// unknown): Credit divides its budget by it when it exceeds a key's own estimate of its nodes.
	Fleet func() int64
	// LeaseLife is how long, from the call that obtained it, a lease may be used; unused tokens are
	// then written off. It must be shorter than central's LeaseLife by more than a call's duration.
	LeaseLife time.Duration
	// OnState, if not nil, is called after an entry's answer was applied. It must not block.
	OnState func(e *local.Entry, st central.State)
	// OnError, if not nil, receives flush errors. It must not block.
	OnError func(error)
	// Now returns the time on a monotonic clock, in nanoseconds (positive).
	Now func() int64
}

// Stats counts the syncer's work. All fields only grow, except LastFlushMicros and Waiting.
type Stats struct {
	Flushes         atomic.Int64 // rounds that sent something
	Keys            atomic.Int64 // keys sent
	FailedKeys      atomic.Int64 // keys whose reconcile failed and stay pending
	BadKeys         atomic.Int64 // keys Redis refused (central.ErrBadKey); retried after a pause
	Burned          atomic.Int64 // unused lease tokens written off at expiry
	FlushMicros     atomic.Int64 // total flush time in µs
	LastFlushMicros atomic.Int64 // duration of the last flush in µs
	Waiting         atomic.Int64 // keys the syncer watches (consumed since their last call, or holding a lease)
	Pending         atomic.Int64 // keys with consumption Redis has not counted, after the last round
}

// Syncer reconciles a local store with Redis: it reports consumption beyond the leases (debt), renews
// leases before they run out, and writes off leases that expired. A key far from its limit holding a
// lease costs nothing until the lease is nearly spent. Create it with [New]; it is safe for concurrent use.
type Syncer struct {
	cfg   Config
	stats Stats

	mu       sync.Mutex // serialises flushes; guards the fields below
	waiting  map[*local.Entry]*watch
	waitPeak int // the most keys waiting since the map was last rebuilt (shrinkLocked)
	entries  []*local.Entry
	batch    []pick
	extra    []pick // keys that join a round that goes anyway (topUpWater)
	lastSent int64  // time of the last round that sent something
	slow     int64  // a decaying maximum of how long rounds took, ns (renewBy)
	updates  []central.Update
	seqs     []uint64
	states   []central.State
	errs     []error
}

// watch is what the syncer remembers of a key it watches.
type watch struct {
	notBefore int64 // no call before then (a key Redis refused)
	fresh     bool  // the syncer saw the entry first in this round
	seen      int64 // consumed plus denied at the last round
	changedAt int64 // when seen last changed
}

// badKeyPause is how long a key Redis refused waits before it is sent again.
const badKeyPause = time.Second

// idleAfter is how long a key must see no requests to count as idle: an idle key's call reports its
// consumption without asking for a new lease.
const idleAfter = time.Second

// New validates cfg and returns a syncer. It starts nothing.
func New(cfg Config) (*Syncer, error) {
	switch {
	case cfg.Store == nil || cfg.Central == nil:
		return nil, errors.New("ratesync: Store and Central are required")
	case cfg.Interval <= 0 || cfg.Horizon <= 0 || cfg.LeaseLife <= 0:
		return nil, errors.New("ratesync: Interval, Horizon and LeaseLife must be positive")
	case cfg.MaxBatch < 1:
		return nil, errors.New("ratesync: MaxBatch must be at least 1")
	case !(cfg.Drift >= 0 && cfg.Drift <= 1):
		return nil, errors.New("ratesync: Drift must be in [0, 1]")
	case cfg.Now == nil:
		return nil, errors.New("ratesync: Now is required")
	}
	return &Syncer{cfg: cfg, waiting: make(map[*local.Entry]*watch)}, nil
}

// Stats returns the syncer's counters.
func (s *Syncer) Stats() *Stats { return &s.stats }

// Run reconciles due keys every Interval until ctx ends. An idle store costs nothing: when no key is
// dirty or watched, Run waits for the store's notification before it starts a timer.
func (s *Syncer) Run(ctx context.Context) {
	t := time.NewTimer(s.cfg.Interval)
	t.Stop()
	defer t.Stop()
	for {
		if s.cfg.Store.Dirty() == 0 && s.stats.Waiting.Load() == 0 {
			select {
			case <-ctx.Done():
				return
			case <-s.cfg.Store.Notify():
			}
		}
		t.Reset(s.cfg.Interval)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.flush(ctx, due); err != nil && s.cfg.OnError != nil && ctx.Err() == nil {
			s.cfg.OnError(err)
		}
	}
}

// Tick runs one round of Run's work now: the due keys' reconciles, if the round goes. For a caller
// that drives the syncer on its own clock (the fleet simulator, internal/virtual) instead of Run.
func (s *Syncer) Tick(ctx context.Context) error { return s.flush(ctx, due) }

// mode says which keys a flush sends.
type mode int

const (
	due     mode = iota // keys with debt, and active keys whose lease is nearly spent
	pending             // every key with debt or consumption Redis has not counted, now (Flush)
	final               // leases are written off; every key with debt or uncounted consumption is sent (Close)
)

// Flush reports to Redis now every key's consumption since its last call: debt beyond the lease is
// charged, and consumption within the lease (already charged in advance) is counted. Keys whose
// reconcile fails stay pending for a later round; the first error is returned. Concurrent calls run
// one after another.
func (s *Syncer) Flush(ctx context.Context) error { return s.flush(ctx, pending) }

// Release writes off every unused lease and reports every key's debt and the consumption Redis has
// not counted; for Close. A lease is not given back (Redis charged it; it refills at the key's rate),
// so a key that holds only a lease costs no call. It returns the first error.
func (s *Syncer) Release(ctx context.Context) error { return s.flush(ctx, final) }

// Want returns the unused lease a call for e should ask for: the node's demand over the horizon,
// at least n and 1, at most the burst.
func (s *Syncer) Want(e *local.Entry, demand float64, n int64) int64 {
	_, burst := e.Limit()
	w := math.Ceil(demand * s.cfg.Horizon.Seconds())
	if !(w >= 1) {
		w = 1
	}
	return min(max(int64(min(w, 1e9)), n), burst)
}

// lowWater returns the unused lease below which an active key asks for more: its demand over the
// time a renewal may wait for others to join its round (coalesceBusy intervals) plus three,
// rounded; 0 for a key whose demand is below one token per that time (the answer's credit covers
// the next request while the lease is renewed).
func (s *Syncer) lowWater(demand float64) int64 {
	return int64(math.Round(demand * (coalesceBusy + 3) * s.cfg.Interval.Seconds()))
}

// topUpWater returns the unused lease below which an active key that is not due yet joins a round
// that goes anyway: twice lowWater, so about one more round's wait of demand. Renewals that would
// otherwise each send their own round a few intervals apart share one, and a node's busy keys fall
// into step. A key so renewed gets a smaller top-up (its lease is not spent as far), so there are
// more key calls and fewer rounds, which is the cheaper side for Redis: a round costs it about as
// much as 15–30 keys (docs/accuracy.md, cost model). On loadgen's hot scenario, rounds went from
// 235–242 to 165–169 in 10 s and key calls from 1,620–1,646 to 2,300–2,331; medium: rounds 535–542
// → 406–409, key calls 12,767–12,873 → 14,791–14,809. Three times lowWater synchronised hot keys a
// little more (153–158 rounds) at 25% more key calls on medium.
func (s *Syncer) topUpWater(demand float64) int64 { return 2 * s.lowWater(demand) }

// renewMargin is how many intervals before a busy key's lease reaches its urgent mark its renewal
// goes (renewBy): one interval for the sync loop's tick, two for demand that runs ahead of its
// estimate. Twice the node's recent slowest round comes on top (a slow Redis).
const renewMargin = 3

// renewBy returns the time by which the renewal of a busy key (urgentWater of at least a token) with
// unused lease left at demand d should go: renewMargin intervals, plus twice the recent slowest
// round, before the lease, spent at its demand, reaches the urgent mark. Until then the key's round,
// once due by lowWater, waits unless another key is ready or urgent. Without it a round went as soon
// as a key crossed lowWater when the node's last round was over coalesceBusy intervals old, which on
// hot keys (a lease lasting about a second) was nearly always: each round topped a lease up by about
// 60% of it, not 90%. On loadgen's hot scenario rounds went from 162–163 to 123–127 in 10 s, key
// calls from 2,284–2,309 to 1,695–1,749 and Redis CPU per decision down 22% (docs/benchmarks.md).
func (s *Syncer) renewBy(now, unused int64, d float64) int64 {
	if !(d > 0) {
		return now
	}
	slack := float64(unused-s.urgentWater(d))/d - renewMargin*s.cfg.Interval.Seconds() - 2*float64(s.slow)/1e9
	if !(slack > 0) {
		return now
	}
	return now + int64(min(slack, 3600)*1e9)
}

// urgentWater returns the unused lease below which a renewal cannot wait for other keys to join
// its round: about two intervals of demand.
func (s *Syncer) urgentWater(demand float64) int64 {
	return int64(math.Round(demand * 2 * s.cfg.Interval.Seconds()))
}

// freshCredit is the largest cold-start credit (tokens) with which a new key's first report waits
// a round for a second request: the minimum cold-start credit, two.
const freshCredit = 2

// rareNeed is how long a key's allowance left must last at its demand for its report to wait for
// the next round rather than go at once: at a demand below one request per rareNeed, a request
// arrives within the wait (coalesce intervals, 200 ms by default) less than 4% of the time.
const rareNeed = 5 * time.Second

// soonRisk is how many requests a sparse key whose allowance is spent may expect, at its demand,
// while its renewal waits for other keys to join its round (see soonWait).
const soonRisk = 0.05

// soonWait returns how many intervals the renewal of a sparse key with nothing left may wait: the
// time over which its demand expects soonRisk requests, from 1 to coalesce intervals.
func (s *Syncer) soonWait(demand float64) int64 {
	w := soonRisk / (demand * s.cfg.Interval.Seconds())
	if !(w < coalesce) {
		return coalesce
	}
	return max(int64(w), 1)
}

// coalesceBusy is how many intervals a renewal that is not urgent may wait, so that renewals share
// script calls. Redis's cost is mostly per call, not per key: on a loaded 8-node loadgen run a
// pipeline cost Redis ~100–200 µs of CPU beyond its keys, a key ~7–30 µs (docs/accuracy.md, cost
// model). Renewals start early enough (lowWater) for the lease to last the wait.
const coalesceBusy = 20

// coalesce is how many intervals the report of a rare key (rareNeed) may wait: shorter than
// coalesceBusy, because a request that finds its allowance spent meanwhile goes to Redis
// synchronously.
const coalesce = 10

func (s *Syncer) flush(ctx context.Context, m mode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	s.entries = s.cfg.Store.Collect(s.entries[:0])
	for _, e := range s.entries {
		if _, ok := s.waiting[e]; !ok {
			s.waiting[e] = &watch{seen: -1, fresh: true}
			e.Seen(now)
		}
	}
	clear(s.entries)
	s.batch = s.batch[:0]
	anyUrgent := m != due
	wait := int64(coalesceBusy)   // intervals the round may wait for more keys, unless one is urgent
	ready := int64(math.MaxInt64) // the round need not go before this (renewBy), unless one is urgent
	for e, w := range s.waiting {
		if e.Evicted() {
			delete(s.waiting, e)
			continue
		}
		if m == final {
			e.Expire(math.MaxInt64)
		} else if e.Unused() > 0 && now >= e.LeaseUntil() {
			s.stats.Burned.Add(e.Expire(now))
		}
		if seen := e.Total() - e.Burned() + e.Denied(); seen != w.seen {
			w.seen, w.changedAt = seen, now
		}
		idle := now-w.changedAt >= int64(idleAfter)
		debt := e.Pending()
		unused := e.Unused()
		active := e.Active()
		send, urgent := false, false
		keyReady := now // when this key's report should go at the latest, if sent
		switch m {
		case due:
			fresh := w.fresh && e.GrantedAt() == 0 && e.Mark() <= freshCredit
			w.fresh = false
			switch {
			case e.Thin() && !debt && !e.Unreported():
				// The last synchronous answer left this node nothing beyond its request: its share of
				// the key is under a token on a fleet larger than the key's burst (hybrid's direct
				// rule). A renewal would cost a call and get nothing; its next request goes to Redis
				// anyway. (On loadgen's fleet simulator, hot keys on 4,096 nodes: a round per such
				// take, 1.2× the central bucket's Redis CPU.)
			case now < w.notBefore || fresh:
				// A key Redis refused waits. A key never answered whose cold-start credit is a
				// couple of tokens (a sparse key: a new client, a new IP) reports its use from the
				// round after the one that first saw it, so that a second request following the
				// first at once is reported in the same call. A key with a larger credit (a hot key
				// on a small fleet) is sent at once: its demand and debt should reach Redis early.
			case debt || active && now >= max(e.RetryAt(), e.RefillAt(1)):
				d := e.Demand()
				// A key this node sees rarely (its allowance left, credit included, lasts rareNeed
				// at its demand: a minority node of a sticky key, a Zipf tail key) is not urgent even
				// with debt or no lease left: the next request is likely seconds away, so its report
				// waits for the next round (at most coalesce intervals), with other keys. A key not
				// yet called has no demand estimate: it counts as rare when its cold-start credit is
				// the minimum (a new client, a new IP), not when it is larger (a hot key on a small
				// fleet, whose demand and debt should reach Redis early).
				left := max(e.Mark()-e.Total(), 0)
				// The demand these rules judge by is the estimate, or the rate seen since the key's
				// last call when that is lower: the estimate follows a key that went quiet over many
				// seconds (it spans about 32 requests), and a node that saw a key once or twice in
				// its first second rates it at 1–2/s until then. Without this, on loadgen's sticky
				// scenario, each request of a minority node (0.07/s) made its round go at once once
				// its lease had expired (8 s in): 172 rounds/s in 30 s, against 68 in the first 10 s.
				dr := d
				if r := e.RecentRate(now); r > 0 && r < d {
					dr = r
				}
				rare := dr > 0 && float64(left+1) >= dr*rareNeed.Seconds() ||
					d == 0 && e.Mark() <= freshCredit // not called yet, with a sparse key's cold-start credit
				// A key with debt or its lease spent needs a round at once, except a key whose demand
				// is under a token per two intervals (urgentWater 0: sparse and medium keys, not hot
				// ones): it waits while its credit lasts, because its next request is likely further
				// away than the round's wait, and the credit answers it meanwhile. Such renewals
				// were what set the pace of rounds on sparse keys: on loadgen's sticky scenario
				// 1,680 rounds in 10 s, 99% of them urgent, 680 with this rule. (Debt reported
				// later is no more debt: a node's credit is renewed only by an answer.)
				sparse := d > 0 && s.urgentWater(d) == 0
				needed := debt || unused <= s.urgentWater(d)
				if sparse {
					needed = left == 0
				}
				switch {
				case needed && !rare && sparse:
					// A sparse key with nothing left waits for its round while the requests it
					// expects over the wait stay under soonRisk (a request meanwhile goes to Redis
					// synchronously): at 0.6/s, 4 intervals. On loadgen's sparse scenario such
					// renewals sent a round at almost every interval on every node (about 28 a
					// second): 6,845 rounds in 30 s, 3,399 with the wait, for 0.0% → 0.1% of
					// decisions on the Redis path (with soonRisk 0.1: 1,960 rounds, 0.2%, and a
					// p99.9 of 214 µs instead of 30 µs).
					send = true
					wait = min(wait, s.soonWait(dr))
				case needed && !rare:
					send, urgent = true, true
				case debt || unused <= s.lowWater(d):
					send = true
					if rare {
						wait = min(wait, coalesce)
					} else if !debt && !sparse {
						// A busy key's renewal need not go before its lease nears the urgent
						// mark: the later it goes, the more it tops up (see renewBy).
						keyReady = s.renewBy(now, unused, d)
					}
				case !rare && !idle && unused <= s.topUpWater(d):
					// Not due yet, but due within about one more round's wait: it joins the round if
					// one goes (after the loop), so that a node's busy keys are renewed together.
					s.extra = append(s.extra, pick{e: e})
					continue
				}
			}
		case pending:
			send = debt || e.Unreported()
		case final:
			send = debt || e.Unreported()
		}
		if send {
			s.batch = append(s.batch, pick{e: e, idle: idle})
			anyUrgent = anyUrgent || urgent
			ready = min(ready, keyReady)
			continue
		}
		if unused == 0 && !debt && !active && !e.Unreported() {
			delete(s.waiting, e)
		}
	}
	defer s.count()
	defer s.shrinkLocked()
	goes := len(s.batch) > 0 && (anyUrgent || now-s.lastSent >= wait*int64(s.cfg.Interval) && now >= ready)
	if goes {
		s.batch = append(s.batch, s.extra...)
	}
	clear(s.extra)
	s.extra = s.extra[:0]
	if !goes {
		clear(s.batch)
		return nil
	}
	s.lastSent = now
	start := time.Now()
	s.stats.Flushes.Add(1)
	var first error
	for lo := 0; lo < len(s.batch); lo += s.cfg.MaxBatch {
		hi := min(lo+s.cfg.MaxBatch, len(s.batch))
		if err := s.flushBatch(ctx, s.batch[lo:hi], now, m); err != nil && first == nil {
			first = err
		}
	}
	clear(s.batch) // drop references so evicted entries can be collected
	took := time.Since(start)
	s.slow = max(int64(took), s.slow-s.slow/8)
	us := took.Microseconds()
	s.stats.FlushMicros.Add(us)
	s.stats.LastFlushMicros.Store(us)
	return first
}

// shrinkMin is the size below which shrinkLocked leaves the syncer's map and slices alone.
const shrinkMin = 4096

// shrinkLocked gives back the memory of rounds far larger than the last: Go maps and slices keep
// their largest size, so a million keys seen once would hold some 40 MB of map and round buffers
// long after they went idle and left the store (measured by BenchmarkRSS). The map is rebuilt once
// it holds under a quarter of its peak (amortised O(1) per key removed), and a slice whose capacity
// is over four times what the last round used is dropped, to be grown again by the next large
// round. s.mu must be held.
func (s *Syncer) shrinkLocked() {
	n := len(s.waiting)
	s.waitPeak = max(s.waitPeak, n)
	if s.waitPeak >= shrinkMin && n < s.waitPeak/4 {
		m := make(map[*local.Entry]*watch, n)
		for e, w := range s.waiting {
			m[e] = w
		}
		s.waiting, s.waitPeak = m, n
	}
	if cap(s.entries) >= shrinkMin && len(s.entries) < cap(s.entries)/4 {
		s.entries = nil
	}
	if cap(s.batch) >= shrinkMin && len(s.batch) < cap(s.batch)/4 {
		s.batch = nil
	}
	if cap(s.extra) >= shrinkMin {
		s.extra = nil // empty after every round
	}
}

// count updates Waiting and Pending; s.mu must be held.
func (s *Syncer) count() {
	s.stats.Waiting.Store(int64(len(s.waiting)))
	n := int64(0)
	for e := range s.waiting {
		if e.Pending() || e.Unreported() {
			n++
		}
	}
	s.stats.Pending.Store(n)
}

// pick is an entry chosen for a round.
type pick struct {
	e    *local.Entry
	idle bool // no requests for idleAfter: report, but ask for no lease
}

func (s *Syncer) flushBatch(ctx context.Context, batch []pick, now int64, m mode) error {
	n := len(batch)
	s.updates = s.updates[:0]
	s.seqs = s.seqs[:0]
	for _, p := range batch {
		e := p.e
		c := e.Next(now)
		want := int64(0)
		if m == due && c.Active && !p.idle && s.cfg.Drift > 0 {
			want = s.Want(e, c.Demand, 0)
		}
		s.updates = append(s.updates, Update(e, c, want, 0))
		s.seqs = append(s.seqs, c.Seq)
	}
	s.states = append(s.states[:0], make([]central.State, n)...)
	s.errs = append(s.errs[:0], make([]error, n)...)
	s.stats.Keys.Add(int64(n))
	err := s.cfg.Central.Reconcile(ctx, s.updates, s.states, s.errs)
	for i, p := range batch {
		e := p.e
		if s.errs[i] != nil {
			if ctx.Err() != nil && errors.Is(s.errs[i], ctx.Err()) {
				continue // the round was cut short by shutdown: the key stays pending for Close's flush
			}
			s.stats.FailedKeys.Add(1)
			if w := s.waiting[e]; w != nil && errors.Is(s.errs[i], central.ErrBadKey) {
				s.stats.BadKeys.Add(1)
				w.notBefore = now + int64(badKeyPause)
			}
			continue
		}
		s.Apply(e, s.seqs[i], s.updates[i], s.states[i], now)
	}
	clear(s.errs)
	return err
}

// Update builds the central update for a call of e.
func Update(e *local.Entry, c local.Call, want, n int64) central.Update {
	rate, burst := e.Limit()
	return central.Update{
		Key: e.Key(), Limit: central.Limit{Rate: rate, Burst: burst},
		Inc: c.Inc, Cum: c.Cum, Acked: c.Acked, Used: c.Used, UAcked: c.UAcked,
		Demand: c.Demand, Want: want, N: n,
	}
}

// Apply turns Redis's answer to u, call number seq of e sent at time sent, into e's new lease and
// credit, and reports it to OnState.
func (s *Syncer) Apply(e *local.Entry, seq uint64, u central.Update, st central.State, sent int64) {
	active := Nodes(st.Demand, u.Demand)
	nodes := active
	if s.cfg.Fleet != nil {
		// The key's estimate (its demand over this node's) is 1 for a node that declared no demand
		// yet; the fleet's size bounds how many nodes can hold credit on the key.
		nodes = max(nodes, s.cfg.Fleet())
	}
	credit := Credit(s.cfg.Drift, st.Tokens, u.Limit.Burst+int64(u.Limit.Rate*s.cfg.Advance.Seconds()), nodes)
	at := s.cfg.Now()
	counted := u.Used
	if st.Status == central.StatusCovered {
		counted += u.N // Redis counted the n the caller takes now
	}
	retryAt := int64(0)
	if st.RetryAfter > 0 {
		retryAt = at + int64(st.RetryAfter)
	}
	e.Grant(local.Answer{
		Seq: seq, Stale: st.Status == central.StatusStale, Charged: st.Charged, Global: st.Tokens,
		Active:   active,
		SentUsed: counted, SentCum: u.Cum, Credit: credit, At: at, LeaseUntil: sent + int64(s.cfg.LeaseLife),
		RetryAt: retryAt, Under: st.Demand < u.Limit.Rate,
	})
	if s.cfg.OnState != nil {
		s.cfg.OnState(e, st)
	}
}

// Credit is the overdraft an answer grants a node beyond its lease: max(1, drift·G/A) tokens, at
// most budget/A, rounded down, where G is the bucket's tokens (micro-tokens), A the nodes that may
// hold credit on the key (the larger of the key's estimate and the fleet's size) and budget what
// can be lent (Burst + Rate·advance, also the floor of the bucket's debt); none when the bucket
// holds less than a token, when the A nodes cannot each have a whole token of the budget, or with
// drift 0. The credits of all nodes add up to one lendable amount at most, whatever their number,
// and so are repaid in full (debt beyond the floor would be forgiven): the floor of one token per
// node it had before issue 21 let a fleet of N nodes overdraw N tokens on one key
// (docs/accuracy.md). A node left without credit that sees the key rarely sends its decisions to
// Redis as one-off takes (hybrid's direct rule).
func Credit(drift float64, tokens, budget, active int64) int64 {
	if !(drift > 0) || active < 1 || tokens < 1_000_000 {
		return 0
	}
	return min(budget/active, max(1, int64(drift*float64(tokens)/1e6/float64(active))))
}

// Nodes estimates how many nodes share a key from the key's demand and this node's: their ratio,
// rounded, from 1 to 1<<20.
func Nodes(keyDemand, nodeDemand float64) int64 {
	if !(nodeDemand > 0) || !(keyDemand > nodeDemand) {
		return 1
	}
	return int64(min(math.Round(keyDemand/nodeDemand), 1<<20))
}

// Watch makes the syncer watch e (a synchronous call gave it a lease), so that the lease is renewed
// or written off in time.
func (s *Syncer) Watch(e *local.Entry) { s.cfg.Store.MarkDirty(e) }
