package hybrid

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/hybridrate/hybridrate/central"
)

const instrumentationName = "github.com/hybridrate/hybridrate/hybrid"

const numStripes = 16

// stripe holds decision counters for a slice of the key space, on its own cache lines, so that
// parallel decisions on different keys do not contend on one counter.
type stripe struct {
	local           atomic.Int64
	localDenied     atomic.Int64
	central         atomic.Int64
	centralDenied   atomic.Int64
	deny            atomic.Int64
	fallbackAllowed atomic.Int64
	fallbackDenied  atomic.Int64
	unrecorded      atomic.Int64 // tokens admitted by a failure policy that could not be recorded (no local room)
}

// Stats is a snapshot of a limiter's counters, for tests, the load generator and dashboards. Every
// count only grows over the limiter's life (but see Local). The zero Stats counts nothing; it is a
// plain value, safe to copy.
//
// # When decisions are counted
//
// The decisions of AllowN's and DecideN's fast path (a key whose lease or credit covers n) are not
// counted one by one: a locked instruction per decision cost the fast path a sixth to a third of
// its time on a hot key (docs/benchmarks.md, issue 24's fifth and sixth passes). Each key's entry
// counts its own, in the word the decision already writes, and Local gets them when the syncer
// next visits the key (each round, every SyncInterval while the limiter runs, and at Flush and
// Close), when the key leaves local memory, and at every 256th decision of a key. So Local may lag
// the fast path by the decisions made since the syncer's last round: up to SyncInterval (more while
// a round waits on a slow Redis, up to the flush timeout). No decision is ever lost from it: after
// a Flush with no decision running, Local is exact. In a rare race, a decision undone because its
// key was evicted meanwhile (it is then decided again, and counted again) is taken off Local once
// it was counted: Local can then step back by one. Every other count is raised by the decision
// itself.
type Stats struct {
	Local, LocalDenied, Central, CentralDenied, DenyCache, FallbackAllowed, FallbackDenied int64 // decisions by outcome (Local lags: see above)

	Unrecorded int64 // tokens admitted by policy without local room to record them
	Keys       int   // keys in local memory
	Pending    int64 // about how many keys have consumption Redis has not counted (debt, or lease use not yet reported); 0 when none
	Evictions  int64 // clean keys evicted

	Flushes, FlushedKeys, FailedKeys int64         // background reconcile work
	BadKeys                          int64         // keys Redis refused (e.g. WRONGTYPE); the other keys of their calls went through
	LeasesWrittenOff                 int64         // unused lease tokens written off when their LeaseLife ended
	FlushTime, LastFlushTime         time.Duration // total and last reconcile round time

	RedisCommands int64  // script calls this limiter sent
	RedisErrors   int64  // failed Redis calls (network, timeout, error replies)
	RedisRejected int64  // calls not sent because the circuit breaker was open
	ScriptLoads   int64  // script (re)loads after NOSCRIPT
	BreakerOpen   bool   // the circuit breaker is not closed
	Breaker       string // the circuit breaker's state: "closed", "open" or "half-open"
	// CheckBreaker is the state of the breaker of synchronous checks alone: "open" (or "half-open")
	// while checks keep timing out at the check timeout (Redis slower than it, or unreachable):
	// decisions that need Redis go to the failure policy without I/O; background reconciles go on,
	// and the breaker above opens only if they fail too.
	CheckBreaker string

	// EvictionPolicy is Redis's maxmemory-policy as last read (every minute), "" until read;
	// EvictionUnsafe reports that it can evict the limiter's keys (it is not noeviction).
	EvictionPolicy string
	EvictionUnsafe bool

	Bans        int   // bans held locally (at most 65,536)
	BanListSize int64 // entries in Redis's ban list, as last read; beyond Bans, keys are checked in Redis
}

// Stats returns a snapshot of the limiter's counters. It does no I/O (the eviction policy is the
// one last read).
func (l *Limiter) Stats() Stats {
	var s Stats
	for i := range l.counts {
		c := &l.counts[i]
		s.Local += c.local.Load()
		s.LocalDenied += c.localDenied.Load()
		s.Central += c.central.Load()
		s.CentralDenied += c.centralDenied.Load()
		s.DenyCache += c.deny.Load()
		s.FallbackAllowed += c.fallbackAllowed.Load()
		s.FallbackDenied += c.fallbackDenied.Load()
		s.Unrecorded += c.unrecorded.Load()
	}
	s.Local += l.store.Stats().Taken.Load() // the fast path's, counted in the entries
	s.Keys = l.store.Len()
	s.Pending = max(l.store.Dirty(), l.syncer.Stats().Pending.Load())
	s.Evictions = l.store.Stats().Evictions.Load()
	ss := l.syncer.Stats()
	s.Flushes, s.FlushedKeys, s.FailedKeys = ss.Flushes.Load(), ss.Keys.Load(), ss.FailedKeys.Load()
	s.BadKeys, s.LeasesWrittenOff = ss.BadKeys.Load(), ss.Burned.Load()
	s.FlushTime = time.Duration(ss.FlushMicros.Load()) * time.Microsecond
	s.LastFlushTime = time.Duration(ss.LastFlushMicros.Load()) * time.Microsecond
	cs := l.central.Stats()
	s.RedisCommands, s.RedisErrors = cs.Commands.Load(), cs.Errors.Load()
	s.RedisRejected, s.ScriptLoads = cs.Rejected.Load(), cs.ScriptLoads.Load()
	s.Breaker = l.central.Breaker().State().String()
	s.BreakerOpen = s.Breaker != "closed"
	s.CheckBreaker = l.central.CheckBreaker().State().String()
	s.Bans, _ = l.deny.Len()
	s.BanListSize = l.bans.total.Load()
	if p, ok := l.evictionPolicy(); ok {
		s.EvictionPolicy, s.EvictionUnsafe = p, central.EvictionUnsafe(p)
	}
	return s
}

// metrics registers the OpenTelemetry instruments; they are all observed from Stats in one callback,
// so a decision touches no instrument: the fast path counts in its entry, the rest in striped
// atomics.
type metrics struct {
	reg metric.Registration
}

// breakerStates are the values of the state attribute of hybridrate.breaker.state.
var breakerStates = [...]string{"closed", "open", "half-open"}

// DefaultInstance returns the default of [WithInstance]: the host name, or "unknown".
func DefaultInstance() string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "unknown"
}

func newMetrics(l *Limiter) (*metrics, error) {
	m := l.opts.meterProvider.Meter(instrumentationName)
	decisions, err1 := m.Int64ObservableCounter("hybridrate.decisions", metric.WithDescription("Decisions, by source and outcome."))
	keys, err2 := m.Int64ObservableGauge("hybridrate.keys", metric.WithDescription("Keys held in local memory."))
	pending, err3 := m.Int64ObservableGauge("hybridrate.pending", metric.WithDescription("Keys with consumption not yet applied to Redis."))
	flushes, err4 := m.Int64ObservableCounter("hybridrate.sync.flushes", metric.WithDescription("Background reconcile rounds."))
	flushed, err5 := m.Int64ObservableCounter("hybridrate.sync.keys", metric.WithDescription("Keys sent in background reconciles."))
	failed, err6 := m.Int64ObservableCounter("hybridrate.sync.failed_keys", metric.WithDescription("Keys whose reconcile failed (kept pending), by reason: bad_key (Redis refused the key, e.g. WRONGTYPE; the other keys of its call went through) or other."))
	cmds, err7 := m.Int64ObservableCounter("hybridrate.redis.commands", metric.WithDescription("Script calls sent to Redis."))
	errs, err8 := m.Int64ObservableCounter("hybridrate.redis.errors", metric.WithDescription("Redis calls that failed or were not sent, by class: error (network, timeout, error reply), breaker_open (refused by the open circuit breaker), noscript (script cache lost, reloaded)."))
	breaker, err9 := m.Int64ObservableGauge("hybridrate.breaker.open", metric.WithDescription("1 while the circuit breaker is open or half-open."))
	evictions, err10 := m.Int64ObservableCounter("hybridrate.evictions", metric.WithDescription("Clean keys evicted from local memory."))
	unsafe, err11 := m.Int64ObservableGauge("hybridrate.redis.eviction_policy_unsafe",
		metric.WithDescription("1 when Redis's maxmemory-policy can evict the limiter's keys (it is not noeviction); absent until read."))
	bans, err12 := m.Int64ObservableGauge("hybridrate.bans",
		metric.WithDescription("Bans: held locally (where=local, at most 65,536) and in Redis's ban list (where=redis, as last read)."))
	state, err13 := m.Int64ObservableGauge("hybridrate.breaker.state", metric.WithDescription("1 for the circuit breaker's current state (closed, open, half-open), 0 for the others."))
	flushTime, err14 := m.Float64ObservableCounter("hybridrate.sync.duration", metric.WithUnit("s"), metric.WithDescription("Time spent in background reconcile rounds."))
	checks, err15 := m.Int64ObservableGauge("hybridrate.breaker.checks.open", metric.WithDescription("1 while the breaker of synchronous checks is open or half-open: checks time out at the check timeout (Redis slower than it, or unreachable), so decisions that need Redis go to the failure policy without I/O; background reconciles go on."))
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7, err8, err9, err10, err11, err12, err13, err14, err15); err != nil {
		return nil, err
	}
	instance := l.opts.instance
	if instance == "" {
		instance = DefaultInstance()
	}
	node := attribute.String("hybridrate.instance", instance)
	fp := attribute.String("hybridrate.failure_policy", l.opts.policy.String())
	src := func(s, outcome string) metric.ObserveOption {
		return metric.WithAttributes(node, fp, attribute.String("source", s), attribute.String("outcome", outcome))
	}
	class := func(c string) metric.ObserveOption {
		return metric.WithAttributes(node, fp, attribute.String("class", c))
	}
	var states [len(breakerStates)]metric.ObserveOption
	for i, st := range breakerStates {
		states[i] = metric.WithAttributes(node, fp, attribute.String("state", st))
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := l.Stats()
		o.ObserveInt64(decisions, s.Local, src("local", "allowed"))
		o.ObserveInt64(decisions, s.LocalDenied, src("local", "denied"))
		o.ObserveInt64(decisions, s.Central, src("central", "allowed"))
		o.ObserveInt64(decisions, s.CentralDenied, src("central", "denied"))
		o.ObserveInt64(decisions, s.DenyCache, src("deny-cache", "denied"))
		o.ObserveInt64(decisions, s.FallbackAllowed, src("fallback", "allowed"))
		o.ObserveInt64(decisions, s.FallbackDenied, src("fallback", "denied"))
		a := metric.WithAttributes(node, fp)
		o.ObserveInt64(keys, int64(s.Keys), a)
		o.ObserveInt64(pending, s.Pending, a)
		o.ObserveInt64(flushes, s.Flushes, a)
		o.ObserveFloat64(flushTime, s.FlushTime.Seconds(), a)
		o.ObserveInt64(flushed, s.FlushedKeys, a)
		o.ObserveInt64(failed, s.FailedKeys-s.BadKeys, metric.WithAttributes(node, fp, attribute.String("reason", "other")))
		o.ObserveInt64(failed, s.BadKeys, metric.WithAttributes(node, fp, attribute.String("reason", "bad_key")))
		o.ObserveInt64(cmds, s.RedisCommands, a)
		o.ObserveInt64(errs, s.RedisErrors, class("error"))
		o.ObserveInt64(errs, s.RedisRejected, class("breaker_open"))
		o.ObserveInt64(errs, s.ScriptLoads, class("noscript"))
		open := int64(0)
		if s.BreakerOpen {
			open = 1
		}
		o.ObserveInt64(breaker, open, a)
		checksOpen := int64(0)
		if s.CheckBreaker != "closed" {
			checksOpen = 1
		}
		o.ObserveInt64(checks, checksOpen, a)
		for i, st := range breakerStates {
			v := int64(0)
			if st == s.Breaker {
				v = 1
			}
			o.ObserveInt64(state, v, states[i])
		}
		o.ObserveInt64(evictions, s.Evictions, a)
		o.ObserveInt64(bans, int64(s.Bans), metric.WithAttributes(node, fp, attribute.String("where", "local")))
		o.ObserveInt64(bans, s.BanListSize, metric.WithAttributes(node, fp, attribute.String("where", "redis")))
		if s.EvictionPolicy != "" {
			v := int64(0)
			if s.EvictionUnsafe {
				v = 1
			}
			o.ObserveInt64(unsafe, v, metric.WithAttributes(node, fp, attribute.String("policy", s.EvictionPolicy)))
		}
		return nil
	}, decisions, keys, pending, flushes, flushed, failed, cmds, errs, breaker, evictions, unsafe, bans, state, flushTime, checks)
	if err != nil {
		return nil, err
	}
	return &metrics{reg: reg}, nil
}

func (m *metrics) close() error { return m.reg.Unregister() }
