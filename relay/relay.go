package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/internal/redisx"
)

// Defaults of the Relay's options, as package hybrid's for its nodes.
const (
	DefaultInterval     = 20 * time.Millisecond
	DefaultHorizon      = 4 * time.Second
	DefaultLeaseLife    = 8 * time.Second
	DefaultActiveWindow = 16 * time.Second
	DefaultAdvance      = time.Second
	DefaultMaxKeys      = 1 << 20
	DefaultFleetBeat    = 5 * time.Second
)

// ErrFull is returned for a key the relay cannot take on: it holds MaxKeys keys, none of them idle.
// A child's failure policy decides such a call, as it decides one Redis cannot answer.
var ErrFull = errors.New("relay: key cap reached")

// config is a Relay's settings: Central from New, the rest from its options (options.go); a zero
// duration or count stands for its default, which New fills in.
type config struct {
	Central      central.Config
	Interval     time.Duration // WithInterval
	Horizon      time.Duration // WithHorizon
	LeaseLife    time.Duration // WithLeaseLife
	ActiveWindow time.Duration // WithActiveWindow
	Advance      time.Duration // WithAdvance
	Fleet        func() int64  // WithFleet
	FleetBeat    time.Duration // WithFleetBeat
	MaxKeys      int           // WithMaxKeys
	ColdCredit   int64         // WithColdCredit
	Now          func() int64  // WithClock
}

// Stats is a snapshot of what a [Relay] did, from [Relay.Stats]. Every count only grows over the
// Relay's life. The zero Stats counts nothing; it is a plain value, safe to copy.
type Stats struct {
	Calls      int64 // child calls answered (keys of reconciles, and takes)
	Takes      int64 // child calls that needed tokens now (N > 0)
	Upstream   int64 // keys sent to Redis (rounds and synchronous refills)
	Rounds     int64 // background rounds that sent something
	SyncCalls  int64 // synchronous refills: a child needed tokens the pool did not have
	Direct     int64 // of which one-off takes forwarded to Redis (a key too rarely asked for a pool)
	Errors     int64 // failed Redis calls
	Burned     int64 // pool tokens written off at the end of their lease life
	Evicted    int64 // keys dropped after ActiveWindow without calls
	FullDenied int64 // calls refused with ErrFull
	Cold       int64 // one-off takes admitted on the cold credit (WithColdCredit)
}

// counters are the live counts behind [Stats].
type counters struct {
	Calls, Takes, Upstream, Rounds, SyncCalls, Direct, Errors, Burned, Evicted, FullDenied, Cold atomic.Int64
}

// Relay serves leases to hybrid limiters (its children) from pools it holds in Redis's buckets.
// Create it with [New]; it is safe for concurrent use. Its methods with a node argument are what
// hybrid.WithUpstream needs.
type Relay struct {
	cfg    config
	client *central.Client
	stats  counters
	fleet  atomic.Int64
	start  time.Time
	inc    atomic.Uint64 // incarnations of the relay's entries

	mu   sync.RWMutex
	keys map[string]*entry // by key: a key has one bucket in Redis whatever its limit (central.BucketKey)

	round sync.Mutex // serialises Tick
	batch []*entry
	ups   []central.Update
	outs  []central.State
	errs  []error
}

// entry is one key's state at the relay: its own node record in Redis (upstream) and its children's.
type entry struct {
	mu  sync.Mutex
	key string
	lim central.Limit
	inc uint64

	// (retryAt: Redis answered the relay's round with less than it wanted and said when to ask
	// again, which it does for a key over its rate; a child short of tokens before then is denied
	// without a call, as a node's would be until its lease's retry.)
	//
	// Upstream, as a node's syncer keeps them (central.Update): chg is what Redis charged the
	// relay's incarnation; cum what the relay consumed (handed on to children, their overdrafts,
	// one-off takes, write-offs); used what children admitted. The pool is chg − cum.
	chg, cum, used int64
	acked, uacked  int64   // the last answer applied: Charged, and the Used it counted
	sentCum        int64   // Cum of the last update answered
	sentAt         int64   // when the last update was answered (0: never)
	declared       float64 // the demand the last update declared
	tokens         int64   // what Redis could lend at the last answer, micro-tokens
	global         float64 // the key's demand over the fleet at the last answer, tokens/s
	resetAfter     time.Duration
	retryAt        int64 // Redis said the pool's lease is short: the next round's refill waits until then
	denyUntil      int64 // Redis denied a synchronous refill: calls short of tokens are denied until then
	poolUntil      int64 // the pool's tokens are written off after this
	bannedUntil    int64 // Redis answered that the key is banned: nothing is served before then
	flight         chan struct{}

	takes     float64 // tokens asked by one-off takes since takesFrom
	takesFrom int64
	takeRate  float64 // their rate over the last measured second, tokens/s
	last      int64   // the last child call

	children  map[string]*child
	nextPrune int64 // when the children's records are next scanned for departed ones
}

// child is a child's record on a key, as reconcile.lua keeps a node's.
type child struct {
	inc    uint64
	chg    int64 // charged to the child's incarnation in total
	cum    int64 // its consumption at its last call
	used   int64
	demand float64
	seen   int64
}

// New returns a relay whose Redis client central.New makes from cc (ClientConfig gives package
// hybrid's defaults): cc.NodeID is the relay's node id on every bucket, and cc.Advance is what
// Redis lends the relay ahead of the refill; the relay lends its children the advance WithAdvance
// gives (none by default), which may not exceed cc.Advance. If cc.Fleet is nil, it is set to the relay's fleet count (WithFleet):
// reconcile.lua's fleet size is the number of limiters that may hold a share of a key, here the
// relays' children. New starts nothing: call Run, or Tick on your own schedule. It does no I/O.
// Errors: an invalid option (wrapping [ErrBadOption]), or central.New's error (wrapped).
func New(cc central.Config, opts ...Option) (*Relay, error) {
	cfg := config{Central: cc}
	if err := option.Apply(&cfg, ErrBadOption, opts); err != nil {
		return nil, err
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.Interval, DefaultInterval)
	def(&cfg.Horizon, DefaultHorizon)
	def(&cfg.LeaseLife, DefaultLeaseLife)
	def(&cfg.ActiveWindow, DefaultActiveWindow)
	def(&cfg.FleetBeat, DefaultFleetBeat)
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.Advance > cc.Advance {
		return nil, badOption("advance %v: more than the central.Config's %v, which Redis lends the relay", cfg.Advance, cc.Advance)
	}
	r := &Relay{cfg: cfg, start: time.Now(), keys: make(map[string]*entry)}
	if r.cfg.Fleet == nil {
		r.cfg.Fleet = r.FleetSize
	}
	if r.cfg.Central.Fleet == nil {
		r.cfg.Central.Fleet = r.cfg.Fleet
	}
	c, err := central.New(r.cfg.Central)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	r.client = c
	if r.cfg.Now == nil {
		r.cfg.Now = func() int64 { return int64(time.Since(r.start)) + 1 }
	}
	return r, nil
}

// Close releases the cluster client central.New built for itself when the central.Config's Client is a
// cluster client created without ContextTimeoutEnabled (central.Client.Close); it never closes that
// client. Call it after Run has returned; the Relay must not be used after Close. Its error is that
// cluster client's Close.
func (r *Relay) Close() error { return r.client.Close() }

// Stats returns a snapshot of the relay's counters (each read atomically, not all at one instant). It
// does no I/O.
func (r *Relay) Stats() Stats {
	c := &r.stats
	return Stats{Calls: c.Calls.Load(), Takes: c.Takes.Load(), Upstream: c.Upstream.Load(),
		Rounds: c.Rounds.Load(), SyncCalls: c.SyncCalls.Load(), Direct: c.Direct.Load(),
		Errors: c.Errors.Load(), Burned: c.Burned.Load(), Evicted: c.Evicted.Load(),
		FullDenied: c.FullDenied.Load(), Cold: c.Cold.Load()}
}

// Keys returns how many keys the relay holds. It does no I/O.
func (r *Relay) Keys() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.keys)
}

// FleetSize returns the fleet registry's count (the limiters and relays of the prefix) at Run's last
// heartbeat, 0 before the first. It does no I/O.
func (r *Relay) FleetSize() int64 { return r.fleet.Load() }

// Client returns the relay's Redis client (its statistics, its breaker).
func (r *Relay) Client() *central.Client { return r.client }

// Beat registers the relay in the fleet registry for three FleetBeats and records the registry's
// count (FleetSize). Run calls it every FleetBeat. It makes one Redis call; its error is that
// call's, wrapped, and FleetSize is then unchanged.
func (r *Relay) Beat(ctx context.Context) error {
	n, err := r.client.Heartbeat(ctx, 3*r.cfg.FleetBeat)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	r.fleet.Store(n)
	return nil
}

// Run calls Tick every Interval and Beat every FleetBeat until ctx ends, then reports what is left
// (one last Tick with a fresh context bounded by a second) and leaves the fleet registry.
func (r *Relay) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	_ = r.Beat(ctx)
	next := time.Now().Add(r.cfg.FleetBeat)
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = r.Tick(fctx)
			_ = r.client.Leave(fctx)
			cancel()
			return
		case <-t.C:
			_ = r.Tick(ctx)
			if time.Now().After(next) {
				_ = r.Beat(ctx)
				next = time.Now().Add(r.cfg.FleetBeat)
			}
		}
	}
}

// lookup returns the key's entry, creating it (nil, ErrFull at the cap).
func (r *Relay) lookup(u central.Update, now int64) (*entry, error) {
	id := u.Key
	r.mu.RLock()
	e := r.keys[id]
	r.mu.RUnlock()
	if e != nil {
		return e, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e = r.keys[id]; e != nil {
		return e, nil
	}
	if len(r.keys) >= r.cfg.MaxKeys {
		r.stats.FullDenied.Add(1)
		return nil, ErrFull
	}
	e = &entry{key: u.Key, lim: u.Limit, inc: r.inc.Add(1), takesFrom: now, children: make(map[string]*child)}
	r.keys[id] = e
	return e, nil
}

// Reconcile answers a child's background round (hybrid.Upstream): each update is applied to the
// key's pool at the relay, in memory. A lease the pool cannot cover now is granted in part, with a
// RetryAfter; the relay's next round asks Redis for more. An update that needs tokens now (N > 0)
// is answered as Take answers it. The only error is for out or errs shorter than updates; each
// update's own failure is in errs[i]. Takes among the updates may call Redis, as Take does.
func (r *Relay) Reconcile(ctx context.Context, node string, updates []central.Update, out []central.State, errs []error) error {
	if len(out) < len(updates) || len(errs) < len(updates) {
		return fmt.Errorf("relay: %d updates, room for %d answers", len(updates), min(len(out), len(errs)))
	}
	for i, u := range updates {
		if u.N > 0 {
			out[i], errs[i] = r.Take(ctx, node, u)
			continue
		}
		errs[i] = nil
		if err := valid(node, u); err != nil {
			errs[i] = err
			continue
		}
		e, err := r.lookup(u, r.cfg.Now())
		if err != nil {
			errs[i] = err
			continue
		}
		e.mu.Lock()
		out[i], _ = r.serve(e, node, u, r.cfg.Now())
		e.mu.Unlock()
		r.stats.Calls.Add(1)
	}
	return nil
}

// Take answers a child's call that needs u.N tokens now (hybrid.Upstream): from the key's pool, or,
// when the pool is short and Redis has not said to wait, after one synchronous call to Redis for the
// key. An error is Redis's (the child's failure policy decides) or ErrFull.
func (r *Relay) Take(ctx context.Context, node string, u central.Update) (central.State, error) {
	if err := valid(node, u); err != nil {
		return central.State{}, err
	}
	r.stats.Calls.Add(1)
	r.stats.Takes.Add(1)
	now := r.cfg.Now()
	e, err := r.lookup(u, now)
	if err != nil {
		return central.State{}, err
	}
	for attempt := 0; ; attempt++ {
		e.mu.Lock()
		now = r.cfg.Now()
		if attempt > 0 && u.Inc == 0 {
			e.takes -= float64(u.N) // serve counts a one-off take's demand again: once is its demand
		}
		st, short := r.serve(e, node, u, now)
		// A key over its rate whose round Redis answered short (retryAt) waits for that round's
		// refill, as a node waits for its lease's retry; a key under its rate asks at once (Redis
		// keeps half its burst in reserve for such calls).
		overRate := e.global >= e.lim.Rate && now < e.retryAt
		if !short || attempt == 2 || now < e.denyUntil || overRate {
			e.mu.Unlock()
			return st, nil
		}
		if u.Inc == 0 && u.Vetted && r.cold(e, u.N) {
			// A key the relay has never been charged for nor consumed: admitted on its cold
			// credit, counted in the next round (see WithColdCredit).
			e.cum += u.N
			e.used += u.N
			e.mu.Unlock()
			r.stats.Cold.Add(1)
			return central.State{Status: central.StatusCovered, Tokens: 0, ResetAfter: 0}, nil
		}
		if u.Inc == 0 && e.chg-e.cum <= 0 && r.direct(e, now) {
			// No pool worth holding (see direct): the take goes to Redis as a one-off take
			// (take.lua, a central bucket's price), counted there at once; as hybrid's direct rule
			// does for a node.
			e.mu.Unlock()
			r.stats.SyncCalls.Add(1)
			r.stats.Upstream.Add(1)
			r.stats.Direct.Add(1)
			st, err := r.client.Take(ctx, central.Update{Key: u.Key, Limit: u.Limit, N: u.N, Want: u.N})
			if err != nil {
				r.stats.Errors.Add(1)
				return central.State{}, err
			}
			if st.Status == central.StatusBanned {
				e.mu.Lock()
				e.bannedUntil = max(e.bannedUntil, r.cfg.Now()+int64(st.RetryAfter))
				e.mu.Unlock()
			}
			return st, nil
		}
		if f := e.flight; f != nil {
			// Another call is asking Redis for this key: wait for its answer, then look again.
			e.mu.Unlock()
			select {
			case <-f:
			case <-ctx.Done():
				return central.State{}, ctx.Err()
			}
			continue
		}
		// The refill needs what the pool lacks now (N: Redis may cover it from the half burst it
		// keeps in reserve, as for a node's synchronous call, and counts it at once; the child's
		// admission is then reported in Used, which Redis counts cumulatively, so not twice).
		up := r.update(e, now, 0)
		up.N = min(max(u.N-max(e.chg-e.cum, 0), 1), e.lim.Burst)
		f := make(chan struct{})
		e.flight = f
		e.mu.Unlock()
		r.stats.SyncCalls.Add(1)
		r.stats.Upstream.Add(1)
		var outs [1]central.State
		var errs [1]error
		err := r.client.Reconcile(ctx, []central.Update{up}, outs[:], errs[:])
		if err == nil {
			err = errs[0]
		}
		e.mu.Lock()
		e.flight = nil
		close(f)
		if err != nil {
			e.mu.Unlock()
			r.stats.Errors.Add(1)
			return central.State{}, err
		}
		r.apply(e, up, outs[0], r.cfg.Now())
		e.mu.Unlock()
	}
}

// serve applies a child's update to the entry (locked) and answers it; short reports a call that
// needed tokens now (N > 0) and could not be covered from the pool.
func (r *Relay) serve(e *entry, node string, u central.Update, now int64) (central.State, bool) {
	e.last = now
	lim := u.Limit
	// The key's limit is the latest child's (a key has one bucket whatever its limit: the relay's
	// own round sends it to Redis, which clamps the bucket to it).
	e.lim = lim
	burstU := lim.Burst * 1_000_000
	pool := e.chg - e.cum
	view := func(status central.Status, charged int64, retry time.Duration) central.State {
		// What Redis could lend at its last answer, plus the pool, less what the relay has consumed
		// beyond it since (its children's overdrafts, not yet reported): a child's overdraft credit
		// is sized on it, and a figure that ignored the debt granted credit on every answer.
		return central.State{Status: status, Charged: charged, Tokens: min(e.tokens+(e.chg-e.cum)*1_000_000, burstU),
			Demand: e.global, RetryAfter: retry, ResetAfter: e.resetAfter}
	}
	banned := now < e.bannedUntil
	if u.Inc == 0 {
		if banned {
			// The key's ban reached the relay with a Redis answer (apply): nothing from the pool.
			return view(central.StatusBanned, 0, time.Duration(e.bannedUntil-now)), false
		}
		// A one-off take: n from the pool, counted at once; nothing is lent.
		e.takes += float64(u.N)
		if pool >= u.N {
			e.cum += u.N
			e.used += u.N
			return view(central.StatusCovered, 0, 0), false
		}
		return view(central.StatusDenied, 0, r.wait(e, lim, u.N-max(pool, 0), now)), true
	}
	c := e.children[node]
	if c != nil && c.inc > u.Inc {
		return view(central.StatusStale, u.Acked, 0), false
	}
	if c == nil || c.inc < u.Inc {
		c = &child{inc: u.Inc, chg: u.Acked, used: u.UAcked}
		e.children[node] = c
	}
	if c.seen > 0 {
		// The child's demand (it counts its local denials, which the relay does not see) over
		// the time since its last call, at most a second of it.
		e.takes += u.Demand * float64(min(now-c.seen, int64(time.Second))) / 1e9
	}
	c.demand, c.seen, c.cum = u.Demand, now, u.Cum
	if u.Used > c.used {
		e.used += u.Used - c.used
		c.used = u.Used
	}
	if u.Cum > c.chg {
		// Consumption beyond the child's charge (its overdraft credit, a failure policy's
		// admissions): the relay's, as debt on its pool.
		e.cum += u.Cum - c.chg
		c.chg = u.Cum
	}
	if banned {
		// The report above is applied (consumption is never forgotten); nothing is granted, and
		// the child denies the key locally for the ban's remaining time, as reconcile.lua answers
		// a node.
		return view(central.StatusBanned, c.chg, time.Duration(e.bannedUntil-now)), false
	}
	status := central.StatusDone
	var retry time.Duration
	have := c.chg - u.Cum
	target := max(u.Want, u.N)
	if target > have {
		mine := r.demand(e, now)
		w := max(e.global-e.declared+mine, mine, u.Demand)
		capacity := lim.Burst + r.advance(lim, w)
		share := target
		if u.Demand > 0 && w > 0 {
			share = int64(math.Floor(float64(capacity)*u.Demand/w + 0.5))
			if share < 1 && r.cfg.Fleet != nil {
				if f := r.cfg.Fleet(); f > 0 && f <= capacity {
					share = 1
				}
			}
		}
		g := min(target, max(share, u.N)) - have
		g = max(min(g, e.chg-e.cum), 0)
		if u.N > 0 && have+g < u.N {
			return view(central.StatusDenied, c.chg, r.wait(e, lim, u.N-have-max(e.chg-e.cum, 0), now)), true
		}
		if short := min(target, max(share, u.N)) - have - g; short > 0 {
			frac := 1.0
			if u.Demand > 0 && w > 0 {
				frac = u.Demand / w
			}
			need := min(short, max(1, (share+1)/2))
			retry = time.Duration(float64(need) * 0.25 * float64(time.Second) / (lim.Rate * frac))
			if e.retryAt > now {
				retry = max(retry, time.Duration(e.retryAt-now))
			}
		}
		e.cum += g
		c.chg += g
	}
	if u.N > 0 {
		status = central.StatusCovered
		uu := max(c.used, u.Used+u.N)
		e.used += uu - c.used
		c.used = uu
	}
	return view(status, c.chg, retry), false
}

// wait is how long a call short of n tokens should wait: until Redis said the key has tokens again,
// or until the refill covers n.
func (r *Relay) wait(e *entry, lim central.Limit, n int64, now int64) time.Duration {
	d := time.Duration(float64(max(n, 1)) / lim.Rate * float64(time.Second))
	if e.denyUntil > now {
		d = max(d, time.Duration(e.denyUntil-now))
	}
	return max(d, time.Microsecond)
}

// advance is what a key under its rate may be lent of the coming refill, reconcile.lua's adv.
func (r *Relay) advance(lim central.Limit, w float64) int64 {
	if w >= lim.Rate {
		return 0
	}
	return min(int64(lim.Rate*r.cfg.Advance.Seconds()), int64(w*r.cfg.Advance.Seconds()))
}

// demand is the relay's demand on the key (locked), tokens/s: what its children asked of it, measured
// over windows of at least a second (tokens their one-off takes asked for, admitted or not, and the
// demand each leasing child declares, over the time between its calls), smoothed across windows.
// Denied requests count: a key over its rate must look so to Redis, which lends the coming refill
// only to keys under their rate. It is measured rather than
// the sum of the demands the children declare: a child that sees a key rarely declares an estimate
// that runs high for a while, and a few dozen of them made the key look over its rate to Redis.
func (r *Relay) demand(e *entry, now int64) float64 {
	if el := now - e.takesFrom; el >= int64(time.Second) {
		m := e.takes / (float64(el) / 1e9)
		if e.takeRate == 0 {
			e.takeRate = m
		} else {
			e.takeRate = 0.3*e.takeRate + 0.7*m
		}
		e.takes, e.takesFrom = 0, now
	}
	if e.takeRate == 0 {
		// The first window: what was asked so far, per second (not extrapolated: a relay that
		// declared 4/s for one request in its first 250 ms made a fresh key look over its rate to
		// Redis, with eight relays, and denied under-limit keys; update keeps the pool of this
		// window to twice what was asked: a pool sized on a few early requests, over the horizon,
		// took a fresh key's whole burst).
		return e.takes / max(float64(now-e.takesFrom)/1e9, 1)
	}
	return e.takeRate
}

// held is what the entry's active children hold unused, as far as the relay knows (their charge
// beyond their consumption at their last call).
func (r *Relay) held(e *entry, now int64) int64 {
	var h int64
	from := now - int64(r.cfg.LeaseLife)
	for _, c := range e.children {
		if c.seen >= from {
			h += max(c.chg-c.cum, 0)
		}
	}
	return h
}

// update is the relay's own update for the entry (locked), wanting at least need in the pool.
func (r *Relay) update(e *entry, now int64, need int64) central.Update {
	d := r.demand(e, now)
	want := int64(0)
	if d > 0 && now-e.last < int64(idleAfter) {
		// The pool plus what the children hold should last Horizon at their demand.
		want = max(int64(math.Ceil(min(d*r.cfg.Horizon.Seconds(), 1e9)))-r.held(e, now), 0)
		if e.takeRate == 0 {
			want = min(want, int64(math.Ceil(2*e.takes)))
		}
	}
	if e.sentAt == 0 && e.chg == 0 && e.takes <= directFirst {
		// The first report of a key seen once or twice (its cold credit): a pool for it would most
		// likely be written off unused; a child that needs more asks, as for any key.
		want = 0
	}
	want = min(max(want, need), e.lim.Burst)
	// reconcile.lua requires Used ≤ Cum. A child's record seeded from what an earlier relay (or an
	// evicted entry) charged it can report admissions this entry never handed on: they are charged.
	e.cum = max(e.cum, e.used)
	return central.Update{Key: e.key, Limit: e.lim, Inc: e.inc, Cum: e.cum, Acked: e.acked, Used: e.used,
		UAcked: e.uacked, Demand: d, Want: want}
}

// apply applies Redis's answer to the relay's update (locked).
func (r *Relay) apply(e *entry, up central.Update, st central.State, now int64) {
	if st.Status == central.StatusStale {
		// Another relay process took this node id over; start a new incarnation.
		e.inc = r.inc.Add(1)
		e.acked, e.uacked = e.chg, e.used
		return
	}
	if st.Charged > e.chg {
		e.poolUntil = now + int64(r.cfg.LeaseLife)
		e.chg = st.Charged
	}
	e.acked = st.Charged
	e.uacked = max(e.uacked, up.Used)
	if st.Status == central.StatusBanned {
		// The key is banned (its ban is in its bucket: issue 23, item 6): Redis applied the report
		// and granted nothing. The pool is not served until the ban ends, to any child, whatever
		// its own copy of the ban list holds.
		e.bannedUntil = now + int64(st.RetryAfter)
		return
	}
	if up.N > 0 {
		if st.Status == central.StatusCovered {
			// Redis counted N as admitted: the child's take that needed them reports them.
			e.uacked = max(e.uacked, up.Used+up.N)
		} else if st.RetryAfter > 0 {

			e.denyUntil = now + int64(st.RetryAfter)
		}
		if st.Status != central.StatusCovered {
			return // a denied call changes nothing else (reconcile.lua takes nothing)
		}
	}
	e.sentCum, e.sentAt, e.declared = up.Cum, now, up.Demand
	e.tokens, e.global, e.resetAfter = st.Tokens, st.Demand, st.ResetAfter
	e.retryAt = 0
	if st.RetryAfter > 0 && e.chg-e.cum < max(up.Want, 1) {
		e.retryAt = now + int64(st.RetryAfter)
	}
}

// direct reports whether a one-off take the entry's pool cannot cover (locked) goes to Redis as a
// one-off take rather than through a pool:
//   - on an owner relay (WithColdCredit set: children shard keys over relays), a key's first
//     directFirst takes in its first window: most keys of a flood of new keys (per-request ids,
//     scanners) are never asked for again, and a pool for one of them costs reconcile.lua's set-up,
//     a node record, and a round to report it, where a one-off take costs what a central bucket's
//     call does. A relay per host keeps pooling from the first take: there a key every host sees
//     at a few requests a second would send most of its decisions to Redis one by one (measured:
//     small per-user bursts at 1.0–1.2× central's Redis CPU instead of 0.6–0.8×);
//   - afterwards, a key this relay's children ask for fewer than directBelow tokens a lease life:
//     a pool would be written off unused.
func (r *Relay) direct(e *entry, now int64) bool {
	if e.takeRate == 0 && e.sentAt == 0 {
		return r.cfg.ColdCredit > 0 && e.takes <= directFirst // e.takes counts this take already (serve)
	}
	return e.takeRate > 0 && r.demand(e, now)*r.cfg.LeaseLife.Seconds() < directBelow
}

// cold reports whether a one-off take of n tokens is admitted on the relay's cold credit (locked):
// the key's first contact at this relay (nothing charged, consumed or reported), within
// WithColdCredit, on a bucket that refills within ActiveWindow.
func (r *Relay) cold(e *entry, n int64) bool {
	return r.cfg.ColdCredit > 0 && n <= r.cfg.ColdCredit && e.sentAt == 0 && e.chg == 0 && e.cum == 0 &&
		e.lim.Rate*r.cfg.ActiveWindow.Seconds() >= float64(e.lim.Burst)
}

// directFirst is how many one-off takes of a new key go to Redis directly before the relay asks for
// a pool (direct).
const directFirst = 2

// idleAfter is how long a key must see no calls to count as idle: an idle key's round reports
// what it must without asking for a pool.
const idleAfter = time.Second

// directBelow: a key whose children ask the relay for fewer tokens than this per lease life (and
// whose pool is empty) has its one-off takes forwarded to Redis as one-off takes.
const directBelow = 3

// reportEvery is how often a key's consumption and demand reach Redis when nothing else sends it:
// the other nodes' shares follow the demand Redis knows.
const reportEvery = time.Second

// lowWaterIntervals: a key whose pool would last fewer intervals than this at its demand is
// refilled in the next round.
const lowWaterIntervals = 5

// due reports whether the entry (locked) goes in this round, after writing off an expired pool.
func (r *Relay) due(e *entry, now int64) bool {
	if e.flight != nil {
		return false
	}
	if now >= e.nextPrune {
		// A child gone for longer than a lease life and the active window holds nothing and
		// declares nothing: its record goes (restarted pods come back as new children).
		for id, c := range e.children {
			if now-c.seen > int64(r.cfg.LeaseLife+r.cfg.ActiveWindow) {
				delete(e.children, id)
			}
		}
		e.nextPrune = now + int64(r.cfg.ActiveWindow)
	}
	if pool := e.chg - e.cum; pool > 0 && e.poolUntil != 0 && now > e.poolUntil {
		e.cum += pool
		r.stats.Burned.Add(pool)
	}
	if e.cum > e.chg {
		return true // debt
	}
	stale := e.sentAt == 0 || now-e.sentAt >= int64(reportEvery)
	// Admissions Redis has not counted go at most once a reportEvery; consumption within what Redis
	// charged the relay (handed on, written off) changes nothing there and is not sent on its own
	// (a churn key seen once cost Redis a second call a decision that way).
	if e.used > e.uacked && stale {
		return true
	}
	if now < e.retryAt {
		return false
	}
	if e.sentAt == 0 && e.chg == 0 {
		// Redis has never charged the relay on this key (its takes went to Redis directly, or were
		// denied): no pool to refill and no record whose demand Redis should know.
		return false
	}
	d := r.demand(e, now)
	// A key whose demand is under a token per lowWaterIntervals is refilled by its children's
	// synchronous calls (the first one short of tokens), not by rounds that could find nothing to
	// do between requests.
	if low := int64(math.Round(d * lowWaterIntervals * r.cfg.Interval.Seconds())); low > 0 {
		if pool := e.chg - e.cum; pool < low && r.update(e, now, 0).Want > pool {
			return true
		}
	}
	// A changed demand, while the key had calls within a lease life (an idle key's declaration
	// leaves Redis's sum after the active window).
	if !stale || now-e.last >= int64(r.cfg.LeaseLife) {
		return false
	}
	// A demand that grew; or one that fell while the key's demand over the fleet is near its rate,
	// where an old declaration would make it look over its rate to Redis (no reserve, no advance).
	// A fall on a key far under its rate changes nothing there worth a call.
	grew := d > 1.5*max(e.declared, 1)
	fell := d < 0.5*e.declared && e.global >= 0.8*e.lim.Rate
	return grew || fell
}

// Tick runs one background round: keys whose pool runs low, whose consumption or demand Redis should
// know, are reconciled in one pipelined call; expired pools are written off; keys without calls for
// ActiveWindow (everything reported) are dropped. It returns the Redis call's error, if any (the keys
// stay due).
func (r *Relay) Tick(ctx context.Context) error {
	r.round.Lock()
	defer r.round.Unlock()
	now := r.cfg.Now()
	r.batch = r.batch[:0]
	r.mu.RLock()
	for _, e := range r.keys {
		r.batch = append(r.batch, e)
	}
	r.mu.RUnlock()
	r.ups = r.ups[:0]
	sent := r.batch[:0]
	var drop []*entry
	for _, e := range r.batch {
		e.mu.Lock()
		switch {
		case r.due(e, now):
			r.ups = append(r.ups, r.update(e, now, 0))
			e.flight = make(chan struct{})
			sent = append(sent, e)
		case now-e.last > int64(r.cfg.ActiveWindow) && e.cum == e.chg && e.used <= e.uacked:
			drop = append(drop, e)
		}
		e.mu.Unlock()
	}
	if len(drop) > 0 {
		r.mu.Lock()
		for _, e := range drop {
			e.mu.Lock()
			if now-e.last > int64(r.cfg.ActiveWindow) && e.flight == nil {
				delete(r.keys, e.key)
				r.stats.Evicted.Add(1)
			}
			e.mu.Unlock()
		}
		r.mu.Unlock()
	}
	if len(sent) == 0 {
		return nil
	}
	r.stats.Rounds.Add(1)
	r.stats.Upstream.Add(int64(len(sent)))
	if cap(r.outs) < len(sent) {
		r.outs, r.errs = make([]central.State, len(sent)), make([]error, len(sent))
	}
	outs, errs := r.outs[:len(sent)], r.errs[:len(sent)]
	clear(errs)
	err := r.client.Reconcile(ctx, r.ups, outs, errs)
	now = r.cfg.Now()
	for i, e := range sent {
		e.mu.Lock()
		if err == nil && errs[i] == nil {
			r.apply(e, r.ups[i], outs[i], now)
		}
		close(e.flight)
		e.flight = nil
		e.mu.Unlock()
	}
	if err != nil {
		r.stats.Errors.Add(1)
		return fmt.Errorf("relay: %w", err)
	}
	for _, e := range errs {
		if e != nil {
			r.stats.Errors.Add(1)
			return fmt.Errorf("relay: %w", e)
		}
	}
	return nil
}

// ClientConfig returns the configuration of a relay's Redis client with package hybrid's defaults
// for its nodes (timeouts, batch size, record pruning, active window, horizon, advance, breaker):
// adjust it, then pass it to New. node is the relay's node id (1 to 64 bytes of
// [A-Za-z0-9_-]), unique among the relays and limiters of the prefix.
func ClientConfig(rdb redis.UniversalClient, prefix, node string) central.Config {
	return central.Config{
		Client:       rdb,
		Prefix:       prefix,
		NodeID:       node,
		SyncTimeout:  50 * time.Millisecond,
		FlushTimeout: 500 * time.Millisecond,
		MaxBatch:     256,
		PruneAge:     10 * time.Minute,
		Recount:      time.Minute,
		ActiveWindow: DefaultActiveWindow,
		Horizon:      DefaultHorizon,
		Advance:      DefaultAdvance,
		Breaker:      redisx.DefaultBreaker(),
	}
}

// Children returns how many children's records the relay holds for key (0 when it does not hold
// the key); lim is not used (a key has one entry whatever its limit) and is kept for callers.
func (r *Relay) Children(key string, lim central.Limit) int {
	r.mu.RLock()
	e := r.keys[key]
	r.mu.RUnlock()
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.children)
}
