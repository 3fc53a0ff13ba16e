package central

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/internal/limits"
	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/lua"
)

// Errors returned by the client. Redis errors are wrapped with %w. redisx.Class sorts all of them.
var (
	// ErrUnavailable means Redis could not serve the call; returned bare or as
	// redisx.ErrBreakerOpen, the breaker is open and the call was not sent. It is the same value as
	// strict.ErrUnavailable.
	ErrUnavailable = redisx.ErrUnavailable
	// ErrBadReply means Redis answered with a reply of an unexpected shape. It is the same value as
	// strict.ErrBadReply.
	ErrBadReply = redisx.ErrBadReply
	// ErrBadKey means Redis could not process one key of a batch (for example its Redis key holds a
	// value of another type: WRONGTYPE); the other keys of the batch were processed.
	ErrBadKey = redisx.NewError(redisx.ClassBadKey, "central: redis refused this key")
	// ErrInvalid is wrapped by every error for an update the client refuses to send (a limit or a
	// counter out of range). Such an update never reaches Redis and never counts against the breaker.
	ErrInvalid = redisx.NewError(redisx.ClassInvalid, "central: invalid request")
)

// Config configures a [Client]. Every field is required unless it says otherwise; package hybrid
// fills in its defaults.
type Config struct {
	// Client is the Redis client: *redis.Client, *redis.ClusterClient (batches are grouped by slot)
	// or a Sentinel failover client.
	Client redis.UniversalClient
	// Prefix starts every Redis key, e.g. "hr"; see [BucketKey].
	Prefix string
	// NodeID identifies this process to the scripts; 1 to 64 bytes of [A-Za-z0-9_-].
	NodeID string
	// SyncTimeout bounds one synchronous take, including its round trip.
	SyncTimeout time.Duration
	// FlushTimeout bounds one Reconcile call (all its pipelines).
	FlushTimeout time.Duration
	// MaxBatch is the largest number of keys one script call reconciles; 1 to 1000.
	MaxBatch int
	// PruneAge is how long a node's per-key record is kept after its last call; longer than any
	// lease a node may hold.
	PruneAge time.Duration
	// Recount is how often, per key, Redis scans the node records: the key's demand is recomputed
	// from the nodes active within ActiveWindow, and departed nodes are pruned.
	Recount time.Duration
	// ActiveWindow is how long after its last call a node's declared demand counts in the key's
	// demand (which sizes the nodes' shares of the burst).
	ActiveWindow time.Duration
	// Horizon is how long a lease is sized to last at a node's demand; Redis keeps half the bucket in
	// reserve when the key's demand over the horizon exceeds the burst while staying under the rate.
	Horizon time.Duration
	// Advance is how much of the coming refill leases may draw on while a key's demand is under its
	// rate (the bucket may be lent down to -Rate·Advance); 0 lends only tokens in the bucket. It
	// widens the overshoot bound by Rate·Advance (docs/accuracy.md).
	Advance time.Duration
	// Breaker configures the circuit breaker of every call. A synchronous take that times out on
	// its own deadline (SyncTimeout) does not count in it, but in a second breaker, of takes only,
	// with the same Threshold, Cooldown and MinSpan: see [Client.Take].
	Breaker redisx.BreakerConfig
	// OnCheckBreaker, if not nil, is called after every change of state of the takes' breaker, on
	// the terms of Breaker.OnStateChange.
	OnCheckBreaker func(redisx.BreakerEvent)
	// Now is the clock for the breaker; nil means time.Now.
	Now func() time.Time
	// Fleet, if not nil, returns the fleet's size (the live limiters sharing the prefix, from the
	// fleet registry; 0 when unknown), which reconcile.lua needs to keep the leases of nodes that see a
	// key rarely within one lendable amount (docs/accuracy.md).
	Fleet func() int64
	// ScriptNow, if not nil, is the time the scripts run at, in µs, instead of Redis TIME: for the
	// fleet simulator (cmd/loadgen -fleet), which runs many nodes on virtual time against a real
	// Redis. Never set it in production: the global state must have one clock (DESIGN.md).
	ScriptNow func() int64
}

// Limit is a token bucket: Rate tokens per second refill a bucket of Burst tokens.
type Limit struct {
	Rate  float64
	Burst int64
}

// Valid reports whether the limit can be sent to the scripts: within the bounds of
// limits.CheckRate, which reconcile.lua checks again. (It said 0 < Rate, so a rate below the
// minimum reached the script and came back as a Redis error: found by hybrid's FuzzAllowN.)
func (l Limit) Valid() bool { return limits.CheckRate(l.Rate, l.Burst) == nil }

// Update is one key's part of a reconcile: what this node consumed, and the lease it wants.
// reconcile.lua documents the model.
type Update struct {
	Key    string  // the limiter key (not the Redis key)
	Limit  Limit   // the limit the scripts apply to the key's bucket (not part of its name: BucketKey)
	Inc    uint64  // incarnation of the node's local entry for Key; 0 for a one-off take without one
	Cum    int64   // tokens this incarnation has consumed in total (admitted, and unused lease written off)
	Acked  int64   // the tokens charged to this incarnation by the last answer the node applied
	Used   int64   // tokens this incarnation admitted in total (Used ≤ Cum); Redis counts them
	UAcked int64   // what the node knows Redis has counted of Used (it may exceed Used by a covered take not yet made)
	Demand float64 // this node's recent demand on the key, tokens/s
	Want   int64   // unused lease the node wants to hold after the call
	N      int64   // tokens the caller needs now (a synchronous call); 0 for a background reconcile
	// Vetted marks a one-off take whose caller checked Key against a complete copy of the ban list
	// and found no ban: a relay may admit it on its cold credit (relay.WithColdCredit) without
	// asking Redis, which would read the key's ban. The scripts do not read it.
	Vetted bool
}

// Status says what Redis did with an [Update].
type Status int8

// The statuses of a [State].
const (
	// StatusCovered: the synchronous call's N is covered by the node's lease.
	StatusCovered Status = 1
	// StatusDenied: the synchronous call's N could not be covered; nothing was granted.
	StatusDenied Status = 0
	// StatusDone: a background reconcile was applied.
	StatusDone Status = -1
	// StatusStale: a late call from an incarnation the node has replaced; nothing changed.
	StatusStale Status = -2
	// StatusBanned: the key is banned (its bucket holds the ban: see [Client.Ban]). What the node
	// reported was applied; nothing was granted or taken, and RetryAfter is the ban's remaining time.
	StatusBanned Status = 2
)

// State is Redis's answer for one key.
type State struct {
	// Status says what was done.
	Status Status
	// Charged is the tokens charged to this incarnation in total: its leases and its debt. The node may
	// consume up to Charged without further charge.
	Charged int64
	// Tokens is the global token count in micro-tokens after the update (negative: debt).
	Tokens int64
	// Demand is the key's demand over all nodes active on it, tokens/s (as they declared it).
	Demand float64
	// RetryAfter is, for a denied call, how long until N could be covered; for a lease shorter than
	// wanted, how long until this node's share of the refill covers it; zero otherwise.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
}

// Stats counts what the client did. All fields only grow.
type Stats struct {
	Takes          atomic.Int64 // synchronous takes sent
	Reconciles     atomic.Int64 // reconcile pipelines sent
	ReconciledKeys atomic.Int64 // keys in reconcile pipelines
	Commands       atomic.Int64 // script calls sent (EVALSHA/EVAL, both paths)
	Errors         atomic.Int64 // failed calls (network, timeout, error replies)
	ScriptLoads    atomic.Int64 // script (re)loads after NOSCRIPT
	Rejected       atomic.Int64 // calls not sent because the breaker was open
}

// Client talks to Redis for package hybrid. Create it with [New]; it is safe for concurrent use.
type Client struct {
	cfg      Config
	cluster  *redis.ClusterClient  // flushRDB, when Config.Client is a cluster client
	syncRDB  redis.UniversalClient // the takes' client: Config.Client bounded by SyncTimeout (redisx.Bound)
	flushRDB redis.UniversalClient // the other calls' client: Config.Client bounded by FlushTimeout
	bounded  redisx.Bounded        // flushRDB's bounding: closed by Close when it is a client of our own
	guard    *redisx.Guard
	checks   *redisx.Breaker // the takes' breaker: takes that time out at SyncTimeout open it
	runner   redisx.Runner   // counts into stats; remembers a server that rejects the #!lua line
	stats    Stats
	keyArgs  []any // the global ARGV values
}

// The client's scripts.
var (
	reconcileScript = redisx.NewScript(lua.Reconcile())
	takeScript      = redisx.NewScript(lua.Take())
	banScript       = redisx.NewScript(lua.Ban())
	bucketBanScript = redisx.NewScript(lua.BucketBan())
)

// New validates cfg and returns a client. It does no I/O.
func New(cfg Config) (*Client, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("central: nil redis client")
	case !redisx.ValidPrefix(cfg.Prefix):
		return nil, ErrBadPrefix
	case !validNodeID(cfg.NodeID):
		return nil, fmt.Errorf("central: bad node id %q: want 1 to 64 bytes of [A-Za-z0-9_-]", cfg.NodeID)
	case cfg.SyncTimeout <= 0 || cfg.FlushTimeout <= 0:
		return nil, errors.New("central: SyncTimeout and FlushTimeout must be positive")
	case cfg.MaxBatch < 1 || cfg.MaxBatch > 1000:
		return nil, fmt.Errorf("central: MaxBatch %d out of range [1, 1000]", cfg.MaxBatch)
	case cfg.PruneAge < time.Millisecond || cfg.Recount < time.Millisecond || cfg.ActiveWindow < time.Millisecond ||
		cfg.Horizon < time.Millisecond:
		return nil, errors.New("central: PruneAge, Recount, ActiveWindow and Horizon must be at least 1ms")
	case cfg.Advance < 0 || cfg.Advance > time.Hour:
		return nil, errors.New("central: Advance must be from 0 to an hour")
	}
	if err := cfg.Breaker.Validate(); err != nil {
		return nil, fmt.Errorf("central: %w", err)
	}
	checks := cfg.Breaker
	checks.OnStateChange = cfg.OnCheckBreaker
	// go-redis applies a context deadline to the socket only with ContextTimeoutEnabled; otherwise a
	// hung Redis holds a call for the client's ReadTimeout (3s by default), far beyond our timeouts.
	// redisx.Bound gives copies of a *redis.Client with our own socket timeouts, sharing its pool,
	// and for a cluster client one new client with ContextTimeoutEnabled, which the Client owns
	// (Close): each call's own deadline (SyncTimeout or FlushTimeout) then bounds it.
	flushB := redisx.Bound(cfg.Client, max(cfg.FlushTimeout, cfg.SyncTimeout))
	syncRDB := flushB.Client
	if !flushB.Owned {
		syncRDB = redisx.Bound(cfg.Client, cfg.SyncTimeout).Client
	}
	c := &Client{
		cfg:      cfg,
		syncRDB:  syncRDB,
		flushRDB: flushB.Client,
		bounded:  flushB,
		guard:    redisx.NewGuard(redisx.NewBreaker(cfg.Breaker, cfg.Now), flushB.Client),
		checks:   redisx.NewBreaker(checks, cfg.Now),
	}
	c.runner.Commands, c.runner.Loads = &c.stats.Commands, &c.stats.ScriptLoads
	if rc, ok := flushB.Client.(*redis.ClusterClient); ok {
		c.cluster = rc
	}
	c.keyArgs = []any{NodeField(cfg.NodeID), cfg.PruneAge.Milliseconds(), cfg.Recount.Milliseconds(),
		cfg.ActiveWindow.Milliseconds(), cfg.Horizon.Milliseconds(), cfg.Advance.Milliseconds(), 0, 0}
	return c, nil
}

func validNodeID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// TimeoutsEnforced reports whether a hung Redis is abandoned after SyncTimeout / FlushTimeout. It is
// true for a *redis.Client (including a Sentinel failover client) and a *redis.ClusterClient, with
// any options; false only for another implementation of redis.UniversalClient.
func (c *Client) TimeoutsEnforced() bool { return c.bounded.Enforced }

// HooksBypassed reports whether the client's calls skip hooks added to Config.Client with AddHook: a
// client created without ContextTimeoutEnabled is used through shallow copies with our own timeouts
// (a *redis.Client) or through a new client with ContextTimeoutEnabled built from its options (a
// cluster client), to bound its calls, and go-redis copies no hooks. Create the client with
// ContextTimeoutEnabled: true to keep them.
func (c *Client) HooksBypassed() bool { return c.bounded.HooksBypassed }

// Close closes the cluster client New created for itself when Config.Client is a cluster client
// without ContextTimeoutEnabled (see [Client.HooksBypassed]); it never closes Config.Client. The
// Client must not be used after Close.
func (c *Client) Close() error { return c.bounded.Close() }

// Preload loads the scripts into Redis (every master of a Cluster) and so opens a pooled
// connection, off the request path. Bounded by FlushTimeout.
func (c *Client) Preload(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	if err := c.runner.Load(ctx, c.flushRDB, reconcileScript); err != nil {
		return fmt.Errorf("central: preload: %w", err)
	}
	for _, sc := range []*redisx.Script{banScript, bucketBanScript, takeScript, fleetScript} {
		if err := c.runner.Load(ctx, c.flushRDB, sc); err != nil {
			return fmt.Errorf("central: preload: %w", err)
		}
	}
	return nil
}

// Stats returns the client's counters.
func (c *Client) Stats() *Stats { return &c.stats }

// Breaker returns the client's circuit breaker: open, it keeps every call from Redis.
func (c *Client) Breaker() *redisx.Breaker { return c.guard.Breaker() }

// CheckBreaker returns the breaker of synchronous takes: open, it keeps takes from Redis while
// they time out at SyncTimeout, and lets reconciles go (see [Client.Take]).
func (c *Client) CheckBreaker() *redisx.Breaker { return c.checks }

// argsPerKey is the number of script arguments per key (reconcile.lua).
const argsPerKey = 1

// argBytes is the length of a key's script argument: ten float64s.
const argBytes = 80

// appendArgs appends u's script argument: inc, cum, acked, used, uacked, demand (tokens/s), want,
// n, rate and burst as little-endian float64s (struct.pack('<dddddddddd'), which the script reads
// with one struct.unpack; validate keeps every integer below 2^53, so each is exact).
func appendArgs(args []any, u Update) []any {
	b := make([]byte, 0, argBytes)
	for _, v := range [...]float64{float64(u.Inc), float64(u.Cum), float64(u.Acked), float64(u.Used),
		float64(u.UAcked), u.Demand, float64(u.Want), float64(u.N), u.Limit.Rate, float64(u.Limit.Burst)} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return append(args, b)
}

// validate checks an update before it is sent: NaN, infinities and out-of-range numbers never reach Redis.
func validate(u Update) error {
	switch {
	case !u.Limit.Valid():
		return fmt.Errorf("%w: key %q: %w", ErrInvalid, u.Key, limits.CheckRate(u.Limit.Rate, u.Limit.Burst))
	case u.Cum < 0 || u.Acked < 0 || u.Cum > 1<<53 || u.Acked > 1<<53 || u.Used < 0 || u.Used > u.Cum ||
		u.UAcked < 0 || u.UAcked > 1<<53:
		return fmt.Errorf("%w: key %q: invalid counters cum=%d acked=%d used=%d uacked=%d", ErrInvalid, u.Key,
			u.Cum, u.Acked, u.Used, u.UAcked)
	case u.N < 0 || u.N > u.Limit.Burst:
		return fmt.Errorf("%w: key %q: n=%d out of range [0, burst=%d]", ErrInvalid, u.Key, u.N, u.Limit.Burst)
	case u.Want < 0 || u.Want > 1e9 || !(u.Demand >= 0 && u.Demand <= 1e9):
		return fmt.Errorf("%w: key %q: want=%d demand=%v out of range", ErrInvalid, u.Key, u.Want, u.Demand)
	case u.Inc > 1<<53:
		return fmt.Errorf("%w: key %q: incarnation out of range", ErrInvalid, u.Key)
	}
	return nil
}

// Take applies u (which should have N > 0) in one synchronous script call bounded by SyncTimeout: the
// answer's Status is StatusCovered when the node's lease now covers N. A key Redis could not process
// returns an error wrapping ErrBadKey.
// It returns ErrUnavailable without I/O while the breaker, or the takes' breaker, is open.
//
// # A slow Redis
//
// A take that times out at SyncTimeout (its caller still waiting) counts as a failure in the takes'
// breaker ([Client.CheckBreaker]) only, not in the breaker of every call: a Redis that answers in
// more than SyncTimeout (a few milliseconds) but well within FlushTimeout is slow, not down, and
// reconciles, which renew the leases, must keep going. Once takes have timed out Threshold times in
// a row over MinSpan, they fail fast (no I/O, and no connection that go-redis closes after each
// timeout) until a probe, one take after Cooldown, is answered in time. Every other failure counts
// in the breaker of every call, as for reconciles; an answer closes both.
func (c *Client) Take(ctx context.Context, u Update) (State, error) {
	if err := validate(u); err != nil {
		return State{}, err
	}
	if !c.guard.AllowCheck(c.checks) {
		c.stats.Rejected.Add(1)
		return State{}, redisx.ErrBreakerOpen
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, c.cfg.SyncTimeout)
	defer cancel()
	keys := []string{BucketKey(c.cfg.Prefix, u.Key)}
	script, args := reconcileScript, []any(nil)
	if u.Inc == 0 {
		// A one-off take (no local entry, or hybrid's direct rule): take.lua, which costs Redis what
		// a central bucket's decision does, rather than reconcile.lua's set-up for one key.
		now := int64(0)
		if c.cfg.ScriptNow != nil {
			now = max(c.cfg.ScriptNow(), 1)
		}
		fleet := int64(0)
		if c.cfg.Fleet != nil {
			fleet = max(c.cfg.Fleet(), 0)
		}
		script = takeScript
		args = []any{u.N, u.Limit.Rate, u.Limit.Burst, c.cfg.Advance.Milliseconds(), c.cfg.ActiveWindow.Milliseconds(), now, fleet}
	} else {
		args = appendArgs(append(make([]any, 0, len(c.keyArgs)+argsPerKey), c.keyArgs...), u)
		c.scriptTime(args)
	}
	c.stats.Takes.Add(1)
	res, err := c.runner.Run(ctx, c.syncRDB, script, keys, args...)
	if err != nil {
		c.stats.Errors.Add(1)
	}
	c.guard.DoneCheck(c.checks, caller, err)
	if err != nil {
		return State{}, fmt.Errorf("central: take %q: %w", u.Key, err)
	}
	var out [1]State
	var errs [1]error
	if err := decodeStates(res, out[:], errs[:]); err != nil {
		return State{}, err
	}
	if errs[0] != nil {
		return State{}, fmt.Errorf("central: take %q: %w", u.Key, errs[0])
	}
	return out[0], nil
}

// record feeds the breaker with the outcome of a call (redisx.Guard.Done) and counts the errors.
// caller is the caller's context, before our own timeout was added.
func (c *Client) record(caller context.Context, err error) {
	if err != nil {
		c.stats.Errors.Add(1)
	}
	c.guard.Done(caller, err)
}

// Reconcile applies updates in pipelined script calls of up to MaxBatch keys (grouped by slot in a
// Cluster) and writes Redis's answer for updates[i] into out[i]; len(out) must equal len(updates).
// errs[i] is non-nil for an update whose call failed; the caller keeps such deltas for a later round.
// The returned error is the first failure, or ErrUnavailable when the breaker kept the batch back.
// A batch that failed with NOSCRIPT is re-sent once after the scripts are loaded.
func (c *Client) Reconcile(ctx context.Context, updates []Update, out []State, errs []error) error {
	if len(out) != len(updates) || len(errs) != len(updates) {
		return fmt.Errorf("central: reconcile: %d updates, %d states, %d errors", len(updates), len(out), len(errs))
	}
	if len(updates) == 0 {
		return nil
	}
	var groups [][]int // indexes into updates, one group per script call
	var first error
	valid := make([]int, 0, len(updates))
	for i, u := range updates {
		errs[i] = nil
		if err := validate(u); err != nil {
			errs[i] = err
			if first == nil {
				first = err
			}
			continue
		}
		valid = append(valid, i)
	}
	groups = c.group(updates, valid)
	if len(groups) == 0 {
		return first
	}
	if !c.guard.Allow() {
		c.stats.Rejected.Add(1)
		for _, g := range groups {
			for _, i := range g {
				errs[i] = redisx.ErrBreakerOpen
			}
		}
		return redisx.ErrBreakerOpen
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	c.stats.Reconciles.Add(1)
	c.stats.ReconciledKeys.Add(int64(len(valid)))

	pending := groups
	var transport error
	for attempt := 0; attempt < 2 && len(pending) > 0; attempt++ {
		cmds, err := c.pipeline(ctx, updates, pending)
		var retry [][]int
		noscript := false
		for gi, g := range pending {
			var cerr error
			if gi < len(cmds) {
				cerr = cmds[gi].Err()
				if cerr == nil && err != nil && cmds[gi].Val() == nil {
					// go-redis does not stamp an error reply met while getting a connection (a
					// WRONGPASS or NOAUTH from the handshake) on the pipeline's commands: they are
					// left unanswered, with no error of their own.
					cerr = err
				}
			} else {
				cerr = err
			}
			if cerr == nil {
				tmp := make([]State, len(g))
				terr := make([]error, len(g))
				if derr := decodeStates(cmds[gi].Val(), tmp, terr); derr != nil {
					cerr = derr
				} else {
					for k, i := range g {
						out[i], errs[i] = tmp[k], terr[k]
						if terr[k] != nil && first == nil {
							first = fmt.Errorf("central: reconcile %q: %w", updates[i].Key, terr[k])
						}
					}
					continue
				}
			}
			if attempt == 0 && redisx.NeedsLoad(cerr) {
				noscript = true
				retry = append(retry, g)
				continue
			}
			for _, i := range g {
				errs[i] = cerr
			}
			if cerr != nil {
				if first == nil {
					first = fmt.Errorf("central: reconcile %d keys: %w", len(valid), cerr)
				}
				if redisx.IsTransport(cerr) {
					transport = cerr
				}
			}
		}
		if noscript {
			if lerr := c.runner.Load(ctx, c.flushRDB, reconcileScript); lerr != nil {
				for _, g := range retry {
					for _, i := range g {
						errs[i] = lerr
					}
				}
				if first == nil {
					first = fmt.Errorf("central: reload scripts: %w", lerr)
				}
				if redisx.IsTransport(lerr) {
					transport = lerr
				}
				retry = nil
			}
		}
		pending = retry
	}
	c.record(caller, transport)
	return first
}

// group splits the valid update indexes into script calls of at most MaxBatch keys; in cluster mode
// the keys of one call share a slot.
func (c *Client) group(updates []Update, valid []int) [][]int {
	var groups [][]int
	chunk := func(idx []int) {
		for start := 0; start < len(idx); start += c.cfg.MaxBatch {
			end := min(start+c.cfg.MaxBatch, len(idx))
			groups = append(groups, idx[start:end:end])
		}
	}
	if c.cluster == nil {
		chunk(valid)
		return groups
	}
	bySlot := make(map[int][]int)
	var order []int
	for _, i := range valid {
		s := redisx.Slot(BucketKey(c.cfg.Prefix, updates[i].Key))
		if _, ok := bySlot[s]; !ok {
			order = append(order, s)
		}
		bySlot[s] = append(bySlot[s], i)
	}
	for _, s := range order {
		chunk(bySlot[s])
	}
	return groups
}

// pipeline sends one EVALSHA per group in one pipeline (the cluster client splits it per node).
func (c *Client) pipeline(ctx context.Context, updates []Update, groups [][]int) ([]*redis.Cmd, error) {
	pipe := c.flushRDB.Pipeline()
	cmds := make([]*redis.Cmd, len(groups))
	for gi, g := range groups {
		keys := make([]string, len(g))
		args := make([]any, 0, len(c.keyArgs)+argsPerKey*len(g))
		args = append(args, c.keyArgs...)
		c.scriptTime(args)
		for k, i := range g {
			keys[k] = BucketKey(c.cfg.Prefix, updates[i].Key)
			args = appendArgs(args, updates[i])
		}
		cmds[gi] = c.runner.EvalSha(ctx, pipe, reconcileScript, keys, args...)
	}
	_, err := pipe.Exec(ctx)
	return cmds, err
}

// scriptTime sets the dynamic global arguments of a call: the fleet's size (reconcile.lua's
// ARGV[7]) when Config.Fleet is set, and the time override (ARGV[8]) when Config.ScriptNow is set
// ("0", Redis TIME, otherwise).
func (c *Client) scriptTime(args []any) {
	if c.cfg.Fleet != nil {
		args[len(c.keyArgs)-2] = max(c.cfg.Fleet(), 0)
	}
	if c.cfg.ScriptNow != nil {
		args[len(c.keyArgs)-1] = max(c.cfg.ScriptNow(), 1)
	}
}

// replyWidth is the number of reply elements per key (reconcile.lua).
const replyWidth = 6

// decodeStates decodes a reconcile reply of replyWidth elements per key into out, and a key Redis
// could not process into errs (wrapping ErrBadKey). It returns an error when the reply as a whole is
// malformed.
func decodeStates(res any, out []State, errs []error) error {
	vals, ok := res.([]any)
	if !ok || len(vals) != replyWidth*len(out) || len(errs) != len(out) {
		return fmt.Errorf("%w: want %d elements, got %T of length %d", ErrBadReply, replyWidth*len(out), res, lenOf(res))
	}
	for k := range out {
		row := vals[replyWidth*k : replyWidth*(k+1)]
		if st, ok := row[0].(int64); ok && st == -3 {
			msg, _ := row[1].(string)
			errs[k] = fmt.Errorf("%w: %s", ErrBadKey, msg)
			out[k] = State{}
			continue
		}
		var v [replyWidth]int64
		for j := range v {
			x, ok := row[j].(int64)
			if !ok {
				return fmt.Errorf("%w: element %d is %T", ErrBadReply, replyWidth*k+j, row[j])
			}
			v[j] = x
		}
		// The script clamps both durations to 1e15µs (about 31 years); a larger value would overflow
		// time.Duration into a negative wait (found by FuzzDecodeStates).
		if v[0] < -2 || v[0] > 2 || v[1] < 0 || v[3] < 0 || v[4] < 0 || v[5] < 0 || v[4] > 1e15 || v[5] > 1e15 {
			return fmt.Errorf("%w: values out of range %v", ErrBadReply, v)
		}
		errs[k] = nil
		out[k] = State{
			Status:     Status(v[0]),
			Charged:    v[1],
			Tokens:     v[2],
			Demand:     float64(v[3]) / 1000,
			RetryAfter: time.Duration(v[4]) * time.Microsecond,
			ResetAfter: time.Duration(v[5]) * time.Microsecond,
		}
	}
	return nil
}

func lenOf(x any) int {
	if v, ok := x.([]any); ok {
		return len(v)
	}
	return -1
}
