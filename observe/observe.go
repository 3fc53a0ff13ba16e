package observe

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
)

const instrumentationName = "github.com/hybridrate/hybridrate/observe"

// Defaults of the Observer's options.
const (
	DefaultNearLimit = 0.1
	DefaultMaxLabels = 256
	DefaultWindow    = 5 * time.Minute
	// Other is the attribute value of a route or tier beyond WithMaxLabels's bound of distinct values.
	Other = "other"
	// None is the attribute value of a missing route or tier.
	None = "none"
)

// HealthReporter is what an [Observer] asks of the Checker it wraps for its health (Observer.Health,
// the dashboard) and its Redis metrics: the hybrid limiter (nil if none yet), the strict rules'
// client and the Enforcer's counters. *policy.Enforcer implements it; a Checker that does not
// reports an empty, OK Health and no such metrics. Its methods are called from the metric
// collector's goroutine and the dashboard's, concurrently with Check: an implementation must be
// safe for concurrent use.
type HealthReporter interface {
	policy.Checker
	Limiter() *hybrid.Limiter
	StrictHealth() policy.StrictHealth
	Stats() policy.Stats
}

var _ HealthReporter = (*policy.Enforcer)(nil)

// config is an Observer's settings, from its options (options.go); the zero values stand for the
// defaults New fills in.
type config struct {
	MeterProvider  metric.MeterProvider // WithMeterProvider
	Instance       string               // WithInstance
	NearLimit      float64              // WithNearLimit
	MaxLabels      int                  // WithMaxLabels
	Window         time.Duration        // WithWindow
	HashKey        []byte               // WithHashKey
	RevealSubjects int                  // WithRevealSubjects
	OnDecision     func(ev *Event)      // WithOnDecision
	OnDeny         func(ev *Event)      // WithOnDeny
	Now            func() time.Time     // WithClock
}

// Event describes one check, for the functions of [WithOnDecision] and [WithOnDeny]. The zero Event is empty.
// The hooks get a pointer valid only during the call: copy what you keep. Do not share it with
// other goroutines during the call.
type Event struct {
	// Time is when the check started.
	Time time.Time
	// Latency is how long the check took.
	Latency time.Duration
	// Route and Tier are the bounded attribute values the check was recorded under.
	Route, Tier string
	// Method is the request's method.
	Method string
	// Path is "local" (no Redis round trip), "central" (a synchronous or strict Redis call, as
	// outcome.SourceCentral names it) or "fallback" (a failure policy answered).
	Path string
	// Result is the policy's answer; Err is non-nil when no decision could be made.
	Result policy.Result
	Err    error
	// Key is, for a denial, a keyed hash (16 hex digits) of the denying rule's dimension values: the
	// same subject always gives the same Key, and no raw key is revealed. Empty when admitted.
	Key string
}

// Denied reports whether the request was denied or would have been: by an enforced rule in a policy
// in shadow mode, or by a rule in shadow mode. It does no I/O.
func (ev *Event) Denied() bool {
	return ev.Err == nil && (!ev.Result.Allowed || shadowDenied(&ev.Result))
}

// shadowDenied reports whether an admitted request would have been denied.
func shadowDenied(res *policy.Result) bool {
	if res.ShadowDenied {
		return true
	}
	for _, d := range res.Decisions {
		if d.Shadow && !d.Allowed {
			return true
		}
	}
	return false
}

// Observer wraps a [Checker], recording each decision. It is itself a Checker (for package
// middleware or package sidecar) and a policy.Target (for a policy.Reloader), forwarding SetPolicy
// to the wrapped Checker. Create it with [New] and [Observer.Close] it when done; it is safe for
// concurrent use.
type Observer struct {
	c   policy.Checker
	cfg config
	key []byte

	counters [numKinds]metric.Int64ObservableCounter // by attrKey.kind (kindLat: none)
	latency  metric.Float64Histogram
	inst     attribute.KeyValue
	attrMu   sync.RWMutex
	attrs    map[attrKey]*cell // guarded by attrMu
	routes   labels
	tiers    labels
	win      *window
	reg      metric.Registration
	reveal   *subjects // nil unless WithRevealSubjects was positive
	rulesMu  sync.Mutex
	rulesFor *policy.Policy      // guarded by rulesMu: the policy whose dims rulesDim holds
	rulesDim map[string][]string // guarded by rulesMu: rule id → dimensions
}

// New returns an Observer of c, configured by opts. It does no I/O and registers one metric
// callback (see [Observer.Close]). Errors: a nil Checker or an invalid option (wrapping
// [ErrBadOption]), or the meter provider's error creating an instrument.
func New(c policy.Checker, opts ...Option) (*Observer, error) {
	if c == nil {
		return nil, badOption("nil Checker")
	}
	var cfg config
	if err := option.Apply(&cfg, ErrBadOption, opts); err != nil {
		return nil, err
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.Instance == "" {
		cfg.Instance = hybrid.DefaultInstance()
	}
	if cfg.NearLimit == 0 {
		cfg.NearLimit = DefaultNearLimit
	}
	if cfg.MaxLabels == 0 {
		cfg.MaxLabels = DefaultMaxLabels
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	o := &Observer{c: c, cfg: cfg, key: append([]byte(nil), cfg.HashKey...), attrs: map[attrKey]*cell{},
		inst: attribute.String("hybridrate.instance", cfg.Instance)}
	if len(o.key) == 0 {
		o.key = make([]byte, 32)
		_, _ = rand.Read(o.key)
	}
	if cfg.RevealSubjects > 0 {
		o.reveal = newSubjects(cfg.RevealSubjects)
	}
	o.routes.max, o.tiers.max = cfg.MaxLabels, cfg.MaxLabels
	o.win = newWindow(int(cfg.Window / time.Second))
	m := cfg.MeterProvider.Meter(instrumentationName)
	var errs [6]error
	o.counters[kindReq], errs[0] = m.Int64ObservableCounter("hybridrate.requests",
		metric.WithDescription("Checks, by outcome (allowed, shadow_denied, denied, missing_key, error), route and tier."))
	o.counters[kindDec], errs[1] = m.Int64ObservableCounter("hybridrate.rule.decisions",
		metric.WithDescription("Counter decisions, by rule, source, outcome, shadow, route and tier."))
	o.counters[kindNear], errs[2] = m.Int64ObservableCounter("hybridrate.rule.near_limit",
		metric.WithDescription("Admitted decisions that left at most the near-limit share of the quota, by rule, route and tier."))
	o.counters[kindShadow], errs[3] = m.Int64ObservableCounter("hybridrate.rule.shadow_denials",
		metric.WithDescription("Would-be denials of rules in shadow mode, by rule, route and tier."))
	o.latency, errs[4] = m.Float64Histogram("hybridrate.check.duration", metric.WithUnit("s"),
		metric.WithDescription("Decision latency, by path (local, central, fallback) and outcome."),
		metric.WithExplicitBucketBoundaries(1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
			2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25))
	health, err := m.Int64ObservableGauge("hybridrate.window.denied",
		metric.WithDescription("Denials in the in-memory window (the dashboard's), by instance."))
	errs[5] = err
	sCalls, err1 := m.Int64ObservableCounter("hybridrate.strict.calls",
		metric.WithDescription("Script calls of the strict rules' Redis client, and commands of its window leases."))
	sErrs, err2 := m.Int64ObservableCounter("hybridrate.strict.errors",
		metric.WithDescription("Strict rules' Redis calls that failed or were not sent, by class: error (network, timeout, error reply), breaker_open (refused by the open circuit breaker)."))
	sState, err3 := m.Int64ObservableGauge("hybridrate.strict.breaker.state",
		metric.WithDescription("1 for the strict client's circuit breaker state (closed, open, half-open), 0 for the others."))
	sLease, err5 := m.Int64ObservableCounter("hybridrate.strict.window_lease_hits",
		metric.WithDescription("Checks of upstream windows served from a window lease, without a Redis call."))
	longVals, err4 := m.Int64ObservableCounter("hybridrate.policy.long_values",
		metric.WithDescription("Dimension values longer than policy.MaxValueLen, counted under their SHA-256."))
	if err := errors.Join(append(errs[:], err1, err2, err3, err4, err5)...); err != nil {
		return nil, fmt.Errorf("observe: %w", err)
	}
	inst := metric.WithAttributes(o.inst)
	classErr := metric.WithAttributes(o.inst, attribute.String("class", "error"))
	classOpen := metric.WithAttributes(o.inst, attribute.String("class", "breaker_open"))
	states := map[string]metric.ObserveOption{}
	for _, st := range []string{"closed", "open", "half-open"} {
		states[st] = metric.WithAttributes(o.inst, attribute.String("state", st))
	}
	o.reg, err = m.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		ob.ObserveInt64(health, o.win.total(o.cfg.Now()).Denied, inst)
		o.attrMu.RLock()
		cells := make([]*cell, 0, len(o.attrs))
		for _, c := range o.attrs {
			cells = append(cells, c)
		}
		o.attrMu.RUnlock()
		for _, c := range cells {
			if c.kind != kindLat {
				ob.ObserveInt64(o.counters[c.kind], c.n.Load(), c.obs)
			}
		}
		enf, ok := o.c.(HealthReporter)
		if !ok {
			return nil
		}
		ob.ObserveInt64(longVals, enf.Stats().LongValues, inst)
		h := enf.StrictHealth()
		ob.ObserveInt64(sCalls, h.Calls, inst)
		ob.ObserveInt64(sLease, h.LeaseHits, inst)
		ob.ObserveInt64(sErrs, h.Errors, classErr)
		ob.ObserveInt64(sErrs, h.Rejected, classOpen)
		for st, opt := range states {
			v := int64(0)
			if st == h.Breaker {
				v = 1
			}
			ob.ObserveInt64(sState, v, opt)
		}
		return nil
	}, health, sCalls, sErrs, sState, sLease, longVals, o.counters[kindReq], o.counters[kindDec], o.counters[kindNear], o.counters[kindShadow])
	if err != nil {
		return nil, fmt.Errorf("observe: %w", err)
	}
	return o, nil
}

// Close unregisters the Observer's metric callback. It does not close the wrapped Checker. Its
// error is the meter provider's; it does no I/O.
func (o *Observer) Close() error { return o.reg.Unregister() }

// Instance returns the Observer's instance attribute value. It does no I/O.
func (o *Observer) Instance() string { return o.cfg.Instance }

// Checker returns the wrapped Checker. It does no I/O.
func (o *Observer) Checker() policy.Checker { return o.c }

// SetPolicy forwards p to the wrapped Checker when it is a policy.Target, and returns an error
// otherwise. It does no I/O of its own; the wrapped Checker's SetPolicy may.
func (o *Observer) SetPolicy(p *policy.Policy) error {
	t, ok := o.c.(policy.Target)
	if !ok {
		return fmt.Errorf("observe: the wrapped %T takes no policy", o.c)
	}
	return t.SetPolicy(p)
}

var _ policy.Target = (*Observer)(nil)

// Check asks the wrapped Checker and records its answer. Its result and error are the wrapped
// Checker's, unchanged; it does no I/O of its own.
func (o *Observer) Check(ctx context.Context, req *policy.Request) (policy.Result, error) {
	if req == nil {
		req = &policy.Request{}
	}
	start := o.cfg.Now()
	res, err := o.c.Check(ctx, req)
	lat := o.cfg.Now().Sub(start)
	o.record(ctx, req, start, lat, res, err)
	return res, err
}

// attrKey names one cached attribute set.
type attrKey struct {
	kind                         uint8
	route, tier, rule, src, outc string
	shadow                       bool
}

// The kinds of attribute sets: one per instrument.
const (
	kindReq    = iota // hybridrate.requests
	kindDec           // hybridrate.rule.decisions
	kindNear          // hybridrate.rule.near_limit
	kindShadow        // hybridrate.rule.shadow_denials
	kindLat           // hybridrate.check.duration
	numKinds
)

// cell is one attribute set of one instrument: its count (observed at collection, so that a check
// costs an atomic add rather than the SDK's per-call attribute handling) or, for the latency
// histogram, its options.
type cell struct {
	kind uint8
	n    atomic.Int64
	obs  metric.ObserveOption
	rec  []metric.RecordOption
}

// cell returns the cell of k, creating it on first use. Beyond maxAttrSets cells, new route and tier
// values share the "other" ones.
func (o *Observer) cell(k attrKey) *cell {
	o.attrMu.RLock()
	c, ok := o.attrs[k]
	o.attrMu.RUnlock()
	if ok {
		return c
	}
	o.attrMu.Lock()
	defer o.attrMu.Unlock()
	if c, ok := o.attrs[k]; ok {
		return c
	}
	if len(o.attrs) >= maxAttrSets {
		k.route, k.tier = Other, Other
		if c, ok := o.attrs[k]; ok {
			return c
		}
	}
	var kv []attribute.KeyValue
	switch k.kind {
	case kindReq:
		kv = []attribute.KeyValue{o.inst, attribute.String("outcome", k.outc), attribute.String("route", k.route),
			attribute.String("tier", k.tier)}
	case kindDec:
		kv = []attribute.KeyValue{o.inst, attribute.String("rule", k.rule), attribute.String("source", k.src),
			attribute.String("outcome", k.outc), attribute.Bool("shadow", k.shadow), attribute.String("route", k.route),
			attribute.String("tier", k.tier)}
	case kindNear, kindShadow:
		kv = []attribute.KeyValue{o.inst, attribute.String("rule", k.rule), attribute.String("route", k.route),
			attribute.String("tier", k.tier)}
	case kindLat:
		kv = []attribute.KeyValue{o.inst, attribute.String("path", k.src), attribute.String("outcome", k.outc)}
	}
	set := attribute.NewSet(kv...)
	c = &cell{kind: k.kind, obs: metric.WithAttributeSet(set), rec: []metric.RecordOption{metric.WithAttributeSet(set)}}
	o.attrs[k] = c
	return c
}

// maxAttrSets bounds the attribute sets (rules × sources × outcomes × routes × tiers can be many).
const maxAttrSets = 1 << 16

// checkOutcome names a check's outcome.
func checkOutcome(res *policy.Result, err error) string {
	switch {
	case err != nil:
		return "error"
	case res.MissingKey && !res.Allowed:
		return "missing_key"
	case !res.Allowed:
		return "denied"
	case shadowDenied(res):
		return "shadow_denied"
	}
	return "allowed"
}

// path names who answered a check.
func path(res *policy.Result) string {
	p := "local"
	for _, d := range res.Decisions {
		switch d.Source {
		case outcome.SourceFallback:
			return "fallback"
		case outcome.SourceCentral, outcome.SourceStrict:
			p = "central"
		}
	}
	return p
}

func (o *Observer) record(ctx context.Context, req *policy.Request, start time.Time, lat time.Duration, res policy.Result, err error) {
	route, tier := o.labels(req)
	outc := checkOutcome(&res, err)
	p := path(&res)
	o.cell(attrKey{kind: kindReq, route: route, tier: tier, outc: outc}).n.Add(1)
	o.latency.Record(ctx, lat.Seconds(), o.cell(attrKey{kind: kindLat, src: p, outc: outc}).rec...)
	var rec sample
	rec.outcome = outc
	for i := range res.Decisions {
		d := &res.Decisions[i]
		dec := "allowed"
		if !d.Allowed {
			dec = "denied"
		}
		src := d.Source.String()
		o.cell(attrKey{kind: kindDec, route: route, tier: tier, rule: d.Rule, src: src, outc: dec, shadow: d.Shadow}).n.Add(1)
		if d.Shadow && !d.Allowed {
			o.cell(attrKey{kind: kindShadow, route: route, tier: tier, rule: d.Rule}).n.Add(1)
		}
		if d.Allowed && !d.Shadow && d.Limit > 0 && float64(d.Remaining) <= o.cfg.NearLimit*float64(d.Limit) {
			o.cell(attrKey{kind: kindNear, route: route, tier: tier, rule: d.Rule}).n.Add(1)
		}
		if i < len(rec.sources) {
			rec.sources[i] = srcOutcome{src: d.Source, denied: !d.Allowed}
			rec.n++
		}
	}
	denied := err == nil && (!res.Allowed || shadowDenied(&res))
	var key string
	if denied {
		rule := res.Rule
		if rule == "" { // shadow: the first counter that would have denied
			for _, d := range res.Decisions {
				if !d.Allowed {
					rule = d.Rule
					break
				}
			}
		}
		key = o.subjectKey(req, rule)
		rec.rule, rec.key, rec.shadow = rule, key, res.Allowed
		if o.reveal != nil {
			o.reveal.add(key, func() string { return o.readable(req, rule) })
		}
	}
	rec.route, rec.tier = route, tier
	o.win.add(start, &rec)
	if o.cfg.OnDecision != nil || denied && o.cfg.OnDeny != nil {
		o.hooks(&Event{Time: start, Latency: lat, Route: route, Tier: tier, Method: req.Method, Path: p, Result: res,
			Err: err, Key: key}, denied)
	}
}

// hooks calls the configured hooks with ev.
func (o *Observer) hooks(ev *Event, denied bool) {
	if o.cfg.OnDecision != nil {
		o.cfg.OnDecision(ev)
	}
	if denied && o.cfg.OnDeny != nil {
		o.cfg.OnDeny(ev)
	}
}

// currentPolicy returns the policy in force in the wrapped Checker, if it tells.
func (o *Observer) currentPolicy() *policy.Policy {
	if pp, ok := o.c.(interface{ Policy() *policy.Policy }); ok {
		return pp.Policy()
	}
	return nil
}

// labels returns the bounded route and tier attribute values of req.
func (o *Observer) labels(req *policy.Request) (route, tier string) {
	route, tier = None, None
	if req.Dims != nil {
		if v, ok := req.Dims.Dimension(policy.DimRoute); ok && v != "" {
			route = o.routes.get(v)
		}
	}
	t := req.Tier
	if p := o.currentPolicy(); p != nil && len(p.Tiers) > 0 {
		if _, ok := p.Tiers[t]; !ok {
			t = p.DefaultTier
		}
	}
	if t != "" {
		tier = o.tiers.get(t)
	}
	return route, tier
}

// subjectKey hashes the values of rule's dimensions in req (all the built-in ones when the rule is
// unknown).
func (o *Observer) subjectKey(req *policy.Request, rule string) string {
	dims := o.ruleDims(rule)
	var b strings.Builder
	b.WriteString(rule)
	for _, d := range dims {
		v := ""
		if req.Dims != nil {
			v, _ = req.Dims.Dimension(d)
		}
		if d == policy.DimMethod && v == "" {
			v = req.Method
		}
		b.WriteByte(0)
		b.WriteString(d)
		b.WriteByte('=')
		b.WriteString(v)
	}
	mac := hmac.New(sha256.New, o.key)
	mac.Write([]byte(b.String()))
	return hex.EncodeToString(mac.Sum(nil)[:8])
}

// maxRevealLen bounds each dimension value kept by WithRevealSubjects, in bytes.
const maxRevealLen = 64

// readable returns rule's dimension values in req as "dim=value, dim=value", each value cut at
// maxRevealLen bytes (and made valid UTF-8).
func (o *Observer) readable(req *policy.Request, rule string) string {
	var b strings.Builder
	for i, d := range o.ruleDims(rule) {
		v := ""
		if req.Dims != nil {
			v, _ = req.Dims.Dimension(d)
		}
		if d == policy.DimMethod && v == "" {
			v = req.Method
		}
		if len(v) > maxRevealLen {
			v = v[:maxRevealLen] + "…"
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(d)
		b.WriteByte('=')
		b.WriteString(strings.ToValidUTF8(v, "\ufffd"))
	}
	return b.String()
}

// Subject returns the readable dimension values of the denied subject whose hashed key is key, when
// WithRevealSubjects is on and this process saw it denied recently. It does no I/O.
func (o *Observer) Subject(key string) (string, bool) {
	if o.reveal == nil {
		return "", false
	}
	return o.reveal.get(key)
}

// builtinDims are the dimensions of a rule the policy in force does not name.
var builtinDims = policy.BuiltinDimensions()

// ruleDims returns the dimensions of rule in the policy in force.
func (o *Observer) ruleDims(rule string) []string {
	p := o.currentPolicy()
	if p == nil {
		return builtinDims
	}
	o.rulesMu.Lock()
	defer o.rulesMu.Unlock()
	if o.rulesFor != p {
		o.rulesFor, o.rulesDim = p, make(map[string][]string, len(p.Rules))
		for _, r := range p.Rules {
			dims := append([]string(nil), r.Dimensions...)
			sort.Strings(dims)
			o.rulesDim[r.ID] = dims
		}
	}
	if dims, ok := o.rulesDim[rule]; ok {
		return dims
	}
	return builtinDims
}

// labels bounds the distinct values of one attribute.
type labels struct {
	max  int
	mu   sync.RWMutex
	seen map[string]bool // guarded by mu
}

// get returns v while fewer than max values have been seen, or v was seen before; Other otherwise.
func (l *labels) get(v string) string {
	l.mu.RLock()
	ok := l.seen[v]
	l.mu.RUnlock()
	if ok {
		return v
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[v] {
		return v
	}
	if len(l.seen) >= l.max {
		return Other
	}
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	l.seen[v] = true
	return v
}
