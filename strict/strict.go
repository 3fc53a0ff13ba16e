package strict

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/internal/limits"
	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/internal/redisx"
)

// Errors returned by a [Limiter] and a [Shaper]. Redis errors are wrapped with %w.
var (
	// ErrInvalid is wrapped by every error for a request they refuse to send: an invalid rule, an
	// empty or oversized subject or tag, a cost n ≤ 0 or above the limit, duplicate checks (and,
	// through [ErrBadOption], by [New]'s errors for an invalid option). Such a request never reaches
	// Redis and never counts against the breaker.
	ErrInvalid = redisx.NewError(redisx.ClassInvalid, "strict: invalid request")
	// ErrBadOption is wrapped by every option error from [New], a nil Option included, as
	// hybrid.ErrBadOption and concurrency.ErrBadOption are; it wraps [ErrInvalid].
	ErrBadOption = fmt.Errorf("%w: bad option", ErrInvalid)
	// ErrUnavailable is wrapped by every error that means Redis could not serve the call: the
	// circuit breaker is open (the call was not sent), or the call failed in transport, timed out or
	// was refused (exactly the errors for which [IsTransport] is true). It is the same value as
	// hybrid.ErrUnavailable and concurrency.ErrUnavailable.
	ErrUnavailable = redisx.ErrUnavailable
	// ErrBadReply means Redis answered with a reply of an unexpected shape.
	ErrBadReply = redisx.ErrBadReply
)

// IsTransport reports whether err means that Redis could not serve the call: it was unreachable or
// timed out, the breaker is open ([ErrUnavailable]), or Redis refused to serve (OOM, READONLY, BUSY,
// NOAUTH, WRONGPASS, NOPERM, CLUSTERDOWN, …). These are the errors after which a caller applies its
// failure policy (fail open, fail closed, a local limiter). It is false for nil, for [ErrInvalid],
// for a reply Redis gave for this key alone (WRONGTYPE, [ErrBadReply]) and for a cancelled context.
// The breaker counts exactly these errors as failures, except those of a caller that gave up.
func IsTransport(err error) bool { return redisx.IsTransport(err) }

// Version is the layout version embedded in every key: "<prefix>:v1:{tag}:rule:alg". The hybrid
// limiter's keys ("<prefix>:v6:b:…" and "<prefix>:v3:x:…", central.Version) never share a name with these.
const Version = "v1"

// Bounds of rules and requests, checked in Go before anything is sent and again by the scripts.
const (
	// MaxLimit is the largest Limit of a rule.
	MaxLimit = limits.MaxLimit
	// MaxSlidingLogLimit is the largest Limit of a [SlidingLog] rule: its key may hold that many members.
	MaxSlidingLogLimit = 100_000
	// MinPeriod is the shortest Period of a rule.
	MinPeriod = limits.MinPeriod
	// MaxPeriod is the longest Period of a rule, 1e14 µs (about 3.2 years).
	MaxPeriod = limits.MaxPeriod
	// MaxChecks is the largest number of checks in one [Limiter.AllowMulti] call.
	MaxChecks = 16
	// MaxKeyLen is the longest subject or tag, in bytes (before hashing); the same bound as
	// hybrid.MaxKeyLen and concurrency.MaxKeyLen.
	MaxKeyLen = limits.MaxKeyLen
)

// Algorithm selects how a [Rule] counts. The zero Algorithm is invalid, so a Rule whose
// Algorithm was forgotten is refused. docs/algorithms.md compares them. It is a plain value, safe
// to copy and share.
type Algorithm uint8

// The strict algorithms. Each is one Lua file in package lua; all of them take weighted costs.
const (
	// TokenBucket admits bursts of up to Limit and refills continuously at Limit per Period.
	TokenBucket Algorithm = iota + 1
	// GCRA answers exactly as TokenBucket does, keeping one short string per key instead of a hash.
	GCRA
	// FixedWindow admits Limit per epoch-aligned window of Period; up to 2·Limit can pass around a
	// window boundary.
	FixedWindow
	// SlidingWindow weighs the previous window's count by its overlap with the last Period
	// (Cloudflare's sliding window counter): smooths FixedWindow's boundary burst at the cost of an
	// estimate.
	SlidingWindow
	// SlidingLog records every admitted request and admits at most Limit in any Period, exactly;
	// memory and work grow with the requests in the window (Limit is capped at MaxSlidingLogLimit).
	SlidingLog
	// UpstreamWindow is FixedWindow as envoyproxy/ratelimit counts: every request counts, admitted
	// or refused, even when another rule of the same call refuses; a request is refused when the
	// count after it is above Limit. N may be 0 (a read: refused only when the count is already
	// above Limit; nothing is written) or above Limit (always refused), up to MaxLimit. Its counters
	// are apart from FixedWindow's.
	UpstreamWindow
)

// String returns the algorithm's name, e.g. "token_bucket". It does no I/O.
func (a Algorithm) String() string {
	switch a {
	case TokenBucket:
		return "token_bucket"
	case GCRA:
		return "gcra"
	case FixedWindow:
		return "fixed_window"
	case SlidingWindow:
		return "sliding_window"
	case SlidingLog:
		return "sliding_log"
	case UpstreamWindow:
		return "upstream_window"
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// code returns the algorithm's short code, used in keys and as the scripts' algorithm argument.
func (a Algorithm) code() string {
	switch a {
	case TokenBucket:
		return "tb"
	case GCRA:
		return "gcra"
	case FixedWindow:
		return "fw"
	case SlidingWindow:
		return "sw"
	case SlidingLog:
		return "sl"
	case UpstreamWindow:
		return "uw"
	}
	return ""
}

// Rule is one limit: Limit units per Period, counted by Algorithm, for each subject. The zero Rule
// is invalid ([Rule.Validate] says why); it is a plain value, safe to copy and share.
type Rule struct {
	// Name identifies the rule in Redis keys; 1 to 64 bytes of [A-Za-z0-9_.-]. Two rules with the same
	// Name and Algorithm share their counters.
	Name string
	// Algorithm selects how the rule counts.
	Algorithm Algorithm
	// Limit is the burst (TokenBucket, GCRA) or the units admitted per window (the others); 1 to
	// MaxLimit (MaxSlidingLogLimit for SlidingLog).
	Limit int64
	// Period is the window, or the time in which a token bucket refills Limit tokens; MinPeriod
	// to MaxPeriod, used to the microsecond. Windows are aligned to the Unix epoch.
	Period time.Duration
}

// Validate reports whether the rule can be sent, with an error wrapping [ErrInvalid] when it
// cannot. It does no I/O.
func (r Rule) Validate() error {
	switch {
	case !validRuleName(r.Name):
		return fmt.Errorf("%w: rule name %q: want 1 to 64 bytes of [A-Za-z0-9_.-]", ErrInvalid, r.Name)
	case r.Algorithm.code() == "":
		return fmt.Errorf("%w: rule %q: unknown algorithm %v", ErrInvalid, r.Name, r.Algorithm)
	case r.Algorithm == SlidingLog && r.Limit > MaxSlidingLogLimit:
		return fmt.Errorf("%w: rule %q: sliding log limit %d above %d", ErrInvalid, r.Name, r.Limit, MaxSlidingLogLimit)
	}
	if err := limits.CheckWindow(r.Limit, r.Period); err != nil {
		return fmt.Errorf("%w: rule %q: %w", ErrInvalid, r.Name, err)
	}
	return nil
}

func validRuleName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// Stats is a snapshot of what a [Limiter] did, from [Limiter.Stats]. Every count only grows over the
// Limiter's life. The zero Stats counts nothing; it is a plain value, safe to copy.
type Stats struct {
	Calls    int64 // script calls sent (EVALSHA and EVAL), and commands of window leases (WithWindowLeases)
	Denied   int64 // calls answered with a denial (or a refused reservation)
	Errors   int64 // calls that failed (network, timeout, error reply, bad reply)
	Rejected int64 // calls not sent because the breaker was open
	// LeaseHits counts the UpstreamWindow checks served from a window lease, without Redis
	// (WithWindowLeases).
	LeaseHits int64
}

// counters are the live counts behind [Stats].
type counters struct {
	Calls     atomic.Int64
	Denied    atomic.Int64
	Errors    atomic.Int64
	Rejected  atomic.Int64
	LeaseHits atomic.Int64
}

// Limiter enforces strict limits in Redis: every request is one atomic script call, so the counts are
// exact whatever the number of processes, at the price of a round trip per decision. Create it with
// [New]; it is safe for concurrent use, and its zero value is not usable.
//
// Most callers want [Limiter.AllowN] (or [Limiter.DecideN], for the whole answer) for one rule, or
// [Limiter.AllowMulti] for several rules that must all admit a request (per API key, per tenant,
// per user) or none of them counts it.
// [Limiter.NewShaper] returns a global leaky-bucket shaper that delays work instead of denying it.
//
// # Keys
//
// Every key is "<prefix>:v1:{<tag>}:<rule>:<algorithm>:<subject>", where the tag is chosen by the
// caller of AllowMulti and is the subject itself for AllowN and DecideN (the subject part is then left out). All
// keys of one call share the tag, so they share a Redis Cluster slot by construction: a CROSSSLOT error
// cannot happen. The tag is part of a counter's identity: check a rule for a subject with the same tag
// every time. With [WithHashedSubjects], tags and subjects appear in keys only as hashes.
//
// # Redis failures
//
// A circuit breaker ([WithBreaker]) keeps a sick Redis off the request path: while it is open, calls
// fail at once with [ErrUnavailable]. A call whose context the caller cancelled, or whose deadline
// (shorter than [WithTimeout]'s) passed, counts neither as a failure nor as a success. After a call
// that Redis did not serve, a Cluster client reloads its slot map, so that a failover is followed
// within moments instead of at go-redis's periodic reload.
//
// # Retries
//
// A call is not idempotent: a command that go-redis re-sends after a read timeout or a dropped
// connection may be counted twice (never admitted twice). A *redis.Client without
// ContextTimeoutEnabled is used through a copy whose socket timeouts are [WithTimeout]'s, and a
// cluster client without it through a client of the Limiter's own with ContextTimeoutEnabled (see
// [WithTimeout]), so a read times out only once the call's deadline has passed, and is not re-sent;
// a client with MaxRetries -1 (MaxRedirects -1 for a cluster client) keeps every charge single
// after a dropped connection too.
//
// # Clock
//
// The scripts read Redis TIME; a process's clock never decides a refill or a window, except the
// windows of UpstreamWindow rules under [WithWindowLeases], which the process's clock decides as
// envoyproxy/ratelimit's does. Every key has a TTL of at least the time its state matters (the time
// to full refill, or the rest of the window), so idle subjects cost no memory.
type Limiter struct {
	rdb     redis.UniversalClient // the caller's client bounded by WithTimeout (redisx.Bound)
	bounded redisx.Bounded        // rdb's bounding: Close closes rdb when it is a client of our own
	cleanup runtime.Cleanup       // closes an rdb of our own if the Limiter is dropped without Close
	opts    options
	guard   *redisx.Guard
	runner  redisx.Runner                                    // counts into stats.Calls
	clock   atomic.Int64                                     // test-only time override in µs; 0 means Redis TIME
	sleep   func(ctx context.Context, d time.Duration) error // WaitN's sleeper; tests replace it
	stats   counters
	leases  *windowLeases // WithWindowLeases; nil without
}

// New returns a Limiter that keeps its counters in rdb: a *redis.Client, a *redis.ClusterClient or
// a Sentinel failover client. It returns the first error of the options, a nil Option included
// (wrapping [ErrBadOption]), and does no I/O; scripts are loaded on first use.
func New(rdb redis.UniversalClient, opts ...Option) (*Limiter, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalid)
	}
	o := newOptions()
	if err := option.Apply(&o, ErrBadOption, opts); err != nil {
		return nil, err
	}
	// A client without ContextTimeoutEnabled ignores the call's deadline on the socket: the calls go
	// on a copy with socket timeouts of o.timeout, or on a cluster client of our own with
	// ContextTimeoutEnabled (redisx.Bound), so a hung Redis costs a call no more.
	b := redisx.Bound(rdb, o.timeout)
	l := &Limiter{rdb: b.Client, bounded: b, opts: o,
		guard: redisx.NewGuard(redisx.NewBreaker(o.breaker, o.now), b.Client), sleep: sleepCtx}
	l.runner.Commands = &l.stats.Calls
	if o.leases {
		l.leases = newWindowLeases(o.leaseLife, MaxWindowLeaseKeys)
	}
	if b.Owned {
		// A Limiter was never closed before it could own a client: close that client once the
		// Limiter is unreachable, for callers that never call Close.
		l.cleanup = runtime.AddCleanup(l, func(c redis.UniversalClient) { _ = c.Close() }, b.Client)
	}
	return l, nil
}

// Close releases what the Limiter holds beyond rdb: for a cluster client created without
// ContextTimeoutEnabled, the cluster client (and its connections) that New built from its options to
// bound every call (see [WithTimeout]). It never closes rdb, and for any other client it does
// nothing. Under [WithWindowLeases], it first sends the lease renewals queued (at most one
// pipeline, bounded by [WithTimeout]) and waits for them. The Limiter must not be used after Close.
// A Limiter that is dropped without Close releases the same once the garbage collector finds it
// unreachable. Its error is the one closing that cluster client returned; it does no other I/O.
func (l *Limiter) Close() error {
	if l.leases != nil {
		l.leases.close()
	}
	l.cleanup.Stop()
	return l.bounded.Close()
}

// BreakerState is the state of the circuit breaker; its String method returns "closed", "open" or
// "half-open".
type BreakerState = redisx.BreakerState

// The breaker states.
const (
	BreakerClosed   = redisx.BreakerClosed   // calls go to Redis
	BreakerOpen     = redisx.BreakerOpen     // calls fail fast with ErrUnavailable
	BreakerHalfOpen = redisx.BreakerHalfOpen // one probe call is in flight; the others fail fast
)

// BreakerState returns the current state of the circuit breaker. It does no I/O.
func (l *Limiter) BreakerState() BreakerState { return l.guard.Breaker().State() }

// Stats returns a snapshot of the Limiter's counters (each read atomically, not all at one instant).
// It does no I/O.
func (l *Limiter) Stats() Stats {
	return Stats{Calls: l.stats.Calls.Load(), Denied: l.stats.Denied.Load(), Errors: l.stats.Errors.Load(),
		Rejected: l.stats.Rejected.Load(), LeaseHits: l.stats.LeaseHits.Load()}
}

// Decision is one rule's answer for one subject, as hybrid.Decision is one limit's answer for one key
// and policy.Decision one counter's; a request's answer over several rules is a [MultiResult], as
// policy.Result is. The zero Decision denies. It is a plain value, safe to copy and share.
type Decision struct {
	// Allowed reports whether the request was admitted and counted. In a [MultiResult] it reports
	// whether this rule had room; the request was counted only if [MultiResult.Allowed].
	Allowed bool
	// Limit is the rule's Limit.
	Limit int64
	// Remaining is how many units the rule has left for the subject now (after this request when it
	// was counted).
	Remaining int64
	// RetryAfter is, when the rule had no room, how long until the request's cost would fit, assuming
	// no other traffic; zero otherwise.
	RetryAfter time.Duration
	// ResetAfter is how long until the rule is back to its full allowance, with no further traffic.
	ResetAfter time.Duration
	// Excess is, for UpstreamWindow, how far the window's count is above Limit (refused units
	// included; Remaining is then 0); 0 otherwise.
	Excess int64
}

// Check is one rule to apply to one subject within [Limiter.AllowMulti]. The zero Check is invalid;
// it is a plain value, safe to copy and share.
type Check struct {
	Rule    Rule   // the limit to apply
	Subject string // who is limited; non-empty, at most MaxKeyLen bytes
	N       int64  // the request's cost under this rule; 1 to Rule.Limit (0 to MaxLimit for UpstreamWindow)
}

// MultiResult is one request's answer over several rules, the answer of [Limiter.AllowMulti]. The
// zero MultiResult denies. It is a plain value; Decisions is the caller's to keep.
type MultiResult struct {
	// Allowed reports whether every rule had room, in which case every rule counted the request;
	// when false, no rule counted anything.
	Allowed bool
	// RetryAfter is the longest RetryAfter of the rules that had no room; zero when Allowed.
	RetryAfter time.Duration
	// Decisions holds each check's answer, in the order of the checks.
	Decisions []Decision
}

// Allow is shorthand for AllowN(ctx, rule, subject, 1).
func (l *Limiter) Allow(ctx context.Context, rule Rule, subject string) (bool, error) {
	return l.AllowN(ctx, rule, subject, 1)
}

// AllowN reports whether a request of cost n by subject is admitted under rule, and counts it if so,
// as [Limiter.DecideN] does, and returns only the answer's Allowed: callers that need the units
// left or the time to retry call DecideN. Its errors are DecideN's.
func (l *Limiter) AllowN(ctx context.Context, rule Rule, subject string, n int64) (bool, error) {
	d, err := l.DecideN(ctx, rule, subject, n)
	return d.Allowed, err
}

// Decide is shorthand for DecideN(ctx, rule, subject, 1).
func (l *Limiter) Decide(ctx context.Context, rule Rule, subject string) (Decision, error) {
	return l.DecideN(ctx, rule, subject, 1)
}

// DecideN reports whether a request of cost n by subject is admitted under rule, and counts it if
// so, in one atomic script call, and returns the whole answer (see [Decision]). A denial is not an
// error: an error means no decision was made (invalid input, wrapping [ErrInvalid]; wrapping
// [ErrUnavailable] while the breaker is open or when Redis could not serve the call, for which
// [IsTransport] is also true; or a reply Redis gave for this key alone). The subject is also the
// hash tag of the key, so it must not contain '}' unless subjects are hashed
// ([WithHashedSubjects]).
func (l *Limiter) DecideN(ctx context.Context, rule Rule, subject string, n int64) (Decision, error) {
	checks := [1]Check{{Rule: rule, Subject: subject, N: n}}
	var out [1]Decision
	allowed, _, err := l.evaluate(ctx, subject, checks[:], out[:])
	if err != nil {
		return Decision{}, err
	}
	out[0].Allowed = allowed
	return out[0], nil
}

// AllowMulti applies every check to one request in one atomic script call: if every rule has room,
// every rule counts the request; if any rule denies, none counts anything. All the keys of the call
// carry tag as their hash tag (typically the tenant), so they live in one Redis Cluster slot; the tag
// must be non-empty, at most MaxKeyLen bytes and, unless subjects are hashed, free of '}'.
// Checks must name distinct (rule, subject) pairs; there may be 1 to MaxChecks of them. A denial is
// not an error; errors are DecideN's ([ErrInvalid] for bad input, never sent; [ErrUnavailable] when
// Redis could not serve the call).
func (l *Limiter) AllowMulti(ctx context.Context, tag string, checks []Check) (MultiResult, error) {
	out := make([]Decision, len(checks))
	allowed, retry, err := l.evaluate(ctx, tag, checks, out)
	if err != nil {
		return MultiResult{}, err
	}
	return MultiResult{Allowed: allowed, RetryAfter: retry, Decisions: out}, nil
}

// evaluate validates the checks, runs the script and decodes its reply into out.
func (l *Limiter) evaluate(ctx context.Context, tag string, checks []Check, out []Decision) (bool, time.Duration, error) {
	if err := l.validTag(tag); err != nil {
		return false, 0, err
	}
	if len(checks) < 1 || len(checks) > MaxChecks {
		return false, 0, fmt.Errorf("%w: %d checks: want 1 to %d", ErrInvalid, len(checks), MaxChecks)
	}
	same := true
	for i, c := range checks {
		if err := c.Rule.Validate(); err != nil {
			return false, 0, err
		}
		if c.Subject == "" || len(c.Subject) > MaxKeyLen {
			return false, 0, fmt.Errorf("%w: rule %q: subject of %d bytes: want 1 to %d", ErrInvalid, c.Rule.Name, len(c.Subject), MaxKeyLen)
		}
		if c.Rule.Algorithm == UpstreamWindow {
			if c.N < 0 || c.N > MaxLimit {
				return false, 0, fmt.Errorf("%w: rule %q: n=%d out of range [0, %d]", ErrInvalid, c.Rule.Name, c.N, MaxLimit)
			}
		} else if c.N < 1 || c.N > c.Rule.Limit {
			return false, 0, fmt.Errorf("%w: rule %q: n=%d out of range [1, limit=%d]", ErrInvalid, c.Rule.Name, c.N, c.Rule.Limit)
		}
		for _, d := range checks[:i] {
			if d.Rule.Name == c.Rule.Name && d.Rule.Algorithm == c.Rule.Algorithm && d.Subject == c.Subject {
				return false, 0, fmt.Errorf("%w: rule %q checked twice for one subject", ErrInvalid, c.Rule.Name)
			}
		}
		same = same && c.Rule.Algorithm == checks[0].Rule.Algorithm
	}
	if l.leases != nil && (!same || checks[0].Rule.Algorithm == UpstreamWindow) {
		if !same {
			for _, c := range checks {
				if c.Rule.Algorithm == UpstreamWindow {
					return false, 0, fmt.Errorf("%w: with window leases, upstream_window rules cannot share a call with other algorithms", ErrInvalid)
				}
			}
		} else {
			return l.evaluateLeased(ctx, tag, l.hashed(tag), checks, out)
		}
	}
	script := allScript
	if same {
		script = algoScripts[checks[0].Rule.Algorithm]
	}
	htag := l.hashed(tag)
	keys := make([]string, 0, 2*len(checks))
	args := make([]any, 0, 2+4*len(checks))
	args = append(args, strconv.FormatInt(l.clock.Load(), 10), "0")
	for _, c := range checks {
		subj := l.hashed(c.Subject)
		if c.Subject == tag {
			subj = htag
		}
		code := c.Rule.Algorithm.code()
		keys = append(keys, key(l.opts.prefix, htag, c.Rule.Name, code, subj))
		if c.Rule.Algorithm == SlidingLog {
			keys = append(keys, key(l.opts.prefix, htag, c.Rule.Name, "sls", subj))
		}
		args = append(args, code, strconv.FormatInt(c.Rule.Limit, 10),
			strconv.FormatInt(c.Rule.Period.Microseconds(), 10), strconv.FormatInt(c.N, 10))
	}
	res, err := l.call(ctx, script, keys, args)
	if err != nil {
		return false, 0, fmt.Errorf("strict: %s on %q: %w", checks[0].Rule.Name, tag, err)
	}
	allowed, err := decode(res, out, func(i int) int64 { return checks[i].Rule.Limit },
		func(i int) bool { return checks[i].Rule.Algorithm == UpstreamWindow })
	if err != nil {
		l.stats.Errors.Add(1)
		return false, 0, err
	}
	var retry time.Duration
	for i := range out {
		if out[i].Allowed {
			out[i].RetryAfter = 0 // a limiter's wait when allowed is always 0
		} else {
			retry = max(retry, out[i].RetryAfter)
		}
	}
	if !allowed {
		l.stats.Denied.Add(1)
	}
	return allowed, retry, nil
}

// validTag checks a hash tag (or a DecideN subject, which is its own tag).
func (l *Limiter) validTag(tag string) error {
	switch {
	case tag == "" || len(tag) > MaxKeyLen:
		return fmt.Errorf("%w: tag or subject of %d bytes: want 1 to %d", ErrInvalid, len(tag), MaxKeyLen)
	case !l.opts.hash && strings.IndexByte(tag, '}') >= 0:
		return fmt.Errorf("%w: tag %q contains '}', which would end the hash tag early (hash the subjects)", ErrInvalid, tag)
	}
	return nil
}

// hashed returns x as it appears in keys: itself, or 32 hex digits of its (keyed) SHA-256.
func (l *Limiter) hashed(x string) string {
	if !l.opts.hash {
		return x
	}
	var sum [sha256.Size]byte
	if len(l.opts.hashKey) > 0 {
		mac := hmac.New(sha256.New, l.opts.hashKey)
		mac.Write([]byte(x))
		mac.Sum(sum[:0])
	} else {
		sum = sha256.Sum256([]byte(x))
	}
	return hex.EncodeToString(sum[:16])
}

// key returns "<prefix>:v1:{<tag>}:<rule>:<code>:<subject>", without the ":<subject>" part when
// the subject is the tag. Rule names and codes contain no ':' and subjects are never empty, so two
// different (tag, rule, code, subject) always give two different keys.
func key(prefix, tag, rule, code, subject string) string {
	if subject == tag {
		return prefix + ":" + Version + ":{" + tag + "}:" + rule + ":" + code
	}
	return prefix + ":" + Version + ":{" + tag + "}:" + rule + ":" + code + ":" + subject // one allocation
}

// call runs one script with the breaker, the timeout, NOSCRIPT recovery and the switch to
// shebang-less scripts for servers that predate Redis 7 script flags (redisx.Runner), and records the
// outcome (redisx.Guard: a caller that gave up says nothing about Redis; a Cluster reloads its slot
// map after a failure).
func (l *Limiter) call(ctx context.Context, sc *redisx.Script, keys []string, args []any) (any, error) {
	if !l.guard.Allow() {
		l.stats.Rejected.Add(1)
		return nil, redisx.ErrBreakerOpen
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, l.opts.timeout)
	defer cancel()
	res, err := l.runner.Run(ctx, l.rdb, sc, keys, args...)
	if err != nil {
		l.stats.Errors.Add(1)
	}
	l.guard.Done(caller, err)
	if err != nil && redisx.IsTransport(err) {
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return res, err
}

// decode decodes a strict reply, {all, then ok, remaining, wait_us, reset_us per rule}, into out
// (Allowed is set to the rule's own ok, RetryAfter to its wait) and returns all. excess, when not nil,
// names the rules whose remaining may be negative (UpstreamWindow's count above its limit), decoded
// into Excess.
func decode(res any, out []Decision, limit func(i int) int64, excess func(i int) bool) (bool, error) {
	vals, ok := res.([]any)
	if !ok || len(vals) != 1+4*len(out) {
		return false, fmt.Errorf("%w: want %d integers, got %T of length %d", ErrBadReply, 1+4*len(out), res, lenOf(res))
	}
	var v [4]int64
	all, ok := vals[0].(int64)
	if !ok || all < 0 || all > 1 {
		return false, fmt.Errorf("%w: verdict %v", ErrBadReply, vals[0])
	}
	for i := range out {
		for j := range v {
			x, ok := vals[1+4*i+j].(int64)
			if !ok {
				return false, fmt.Errorf("%w: element %d is %T", ErrBadReply, 1+4*i+j, vals[1+4*i+j])
			}
			v[j] = x
		}
		lim := limit(i)
		var over int64
		if v[1] < 0 && v[1] >= -1e15 && excess != nil && excess(i) {
			over, v[1] = -v[1], 0 // a count above the limit (UpstreamWindow)
		}
		// The scripts clamp both durations to 1e15µs (about 31 years); a larger value would overflow
		// time.Duration into a wrong (even negative) wait.
		if v[0] < 0 || v[0] > 1 || v[1] < 0 || v[1] > lim || v[2] < 0 || v[3] < 0 || v[2] > 1e15 || v[3] > 1e15 ||
			all == 1 && v[0] == 0 {
			return false, fmt.Errorf("%w: rule %d values out of range %v", ErrBadReply, i, v)
		}
		out[i] = Decision{
			Allowed:    v[0] == 1,
			Limit:      lim,
			Remaining:  v[1],
			RetryAfter: time.Duration(v[2]) * time.Microsecond,
			ResetAfter: time.Duration(v[3]) * time.Microsecond,
			Excess:     over,
		}
	}
	return all == 1, nil
}

// sleepCtx waits for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lenOf returns the length of an array reply, or -1, for error messages.
func lenOf(x any) int {
	if v, ok := x.([]any); ok {
		return len(v)
	}
	return -1
}
