package observe

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
)

// maxSlotKeys bounds the distinct denied keys and deny groups one second of the window holds; the
// rest are counted under "other".
const maxSlotKeys = 128

// srcOutcome is one decision's source and outcome.
type srcOutcome struct {
	src    outcome.Source
	denied bool
}

// sample is what the window keeps of one check.
type sample struct {
	outcome           string
	route, tier, rule string
	key               string
	shadow            bool // admitted; rule would have denied
	sources           [8]srcOutcome
	n                 int
}

// group names a (route, rule, tier) triple of denials.
type group struct {
	Route, Rule, Tier string
	Shadow            bool
}

// slot is one second of the window.
type slot struct {
	mu      sync.Mutex // guards the fields below
	sec     int64      // Unix second the slot holds; other seconds are stale
	counts  Second
	sources map[SourceCount]int64 // keyed with N == 0
	groups  map[group]int64
	keys    map[KeyCount]int64 // keyed with N == 0
}

// window is a ring of one-second slots.
type window struct {
	slots                               []slot
	allowed, denied, shadowDenied, errs atomic.Int64 // since the start
}

func newWindow(seconds int) *window { return &window{slots: make([]slot, seconds)} }

func (w *window) add(t time.Time, s *sample) {
	sec := t.Unix()
	sl := &w.slots[int(sec%int64(len(w.slots)))]
	sl.mu.Lock()
	if sl.sec != sec {
		sl.sec = sec
		sl.counts = Second{Unix: sec}
		clear(sl.sources)
		clear(sl.groups)
		clear(sl.keys)
	}
	switch s.outcome {
	case "allowed":
		sl.counts.Allowed++
	case "shadow_denied":
		sl.counts.Allowed++
		sl.counts.ShadowDenied++
	case "error":
		sl.counts.Errors++
	default:
		sl.counts.Denied++
	}
	if sl.sources == nil {
		sl.sources = make(map[SourceCount]int64)
	}
	for _, so := range s.sources[:s.n] {
		outc := "allowed"
		if so.denied {
			outc = "denied"
		}
		sl.sources[SourceCount{Source: so.src.String(), Outcome: outc}]++
	}
	if s.rule != "" || s.key != "" {
		if sl.groups == nil {
			sl.groups = make(map[group]int64)
			sl.keys = make(map[KeyCount]int64)
		}
		g := group{Route: s.route, Rule: s.rule, Tier: s.tier, Shadow: s.shadow}
		if _, ok := sl.groups[g]; !ok && len(sl.groups) >= maxSlotKeys {
			g = group{Route: Other, Rule: Other, Tier: Other}
		}
		sl.groups[g]++
		k := KeyCount{Key: s.key, Rule: s.rule, Shadow: s.shadow}
		if _, ok := sl.keys[k]; !ok && len(sl.keys) >= maxSlotKeys {
			k = KeyCount{Key: Other, Rule: Other}
		}
		sl.keys[k]++
	}
	sl.mu.Unlock()

	switch s.outcome {
	case "allowed":
		w.allowed.Add(1)
	case "shadow_denied":
		w.allowed.Add(1)
		w.shadowDenied.Add(1)
	case "error":
		w.errs.Add(1)
	default:
		w.denied.Add(1)
	}
}

// total returns the counts of the window's seconds up to now.
func (w *window) total(now time.Time) Second {
	var t Second
	for _, s := range w.seconds(now) {
		t.Allowed += s.Allowed
		t.Denied += s.Denied
		t.ShadowDenied += s.ShadowDenied
		t.Errors += s.Errors
	}
	return t
}

// seconds returns the counts of each second of the window ending at now, oldest first.
func (w *window) seconds(now time.Time) []Second {
	n := int64(len(w.slots))
	end := now.Unix()
	out := make([]Second, 0, n)
	for sec := end - n + 1; sec <= end; sec++ {
		sl := &w.slots[int(((sec%n)+n)%n)]
		sl.mu.Lock()
		c := Second{Unix: sec}
		if sl.sec == sec {
			c = sl.counts
		}
		sl.mu.Unlock()
		out = append(out, c)
	}
	return out
}

// Second counts the checks of one second. The zero Second counts nothing. It is a plain value, the
// caller's once returned: safe to copy and to read from any goroutine.
type Second struct {
	Unix         int64 `json:"t"`            // the second, in Unix time
	Allowed      int64 `json:"allowed"`      // admitted (shadow denials included)
	Denied       int64 `json:"denied"`       // denied (missing keys included)
	ShadowDenied int64 `json:"shadowDenied"` // admitted, but a rule in shadow mode would have denied
	Errors       int64 `json:"errors"`       // no decision could be made
}

// Totals counts every check since the Observer was created. The zero Totals counts nothing. It is a
// plain value, the caller's once returned: safe to copy and to read from any goroutine.
type Totals struct {
	Allowed      int64 `json:"allowed"`      // admitted (shadow denials included)
	Denied       int64 `json:"denied"`       // denied (missing keys included)
	ShadowDenied int64 `json:"shadowDenied"` // admitted, but a rule in shadow mode would have denied
	Errors       int64 `json:"errors"`       // no decision could be made
}

// DenyCount counts the denials of one route, rule and tier in a span. The zero DenyCount counts
// nothing. It is a plain value, the caller's once returned: safe to copy and to read from any
// goroutine.
type DenyCount struct {
	Route  string  `json:"route"`
	Rule   string  `json:"rule"`
	Tier   string  `json:"tier"`
	Shadow bool    `json:"shadow"` // would-be denials: the requests were admitted
	N      int64   `json:"n"`
	Rate   float64 `json:"rate"` // denials per second over the span
}

// KeyCount counts the denials of one hashed key (an Event.Key) by one rule. The zero KeyCount
// counts nothing. It is a plain value, the caller's once returned: safe to copy and to read from
// any goroutine.
type KeyCount struct {
	Key    string `json:"key"`
	Rule   string `json:"rule"`
	Shadow bool   `json:"shadow"` // would-be denials: the requests were admitted
	N      int64  `json:"n"`
	// Subject is the key's readable dimension values ("api_key=abc"), when WithRevealSubjects is
	// on and this process saw the key denied; empty otherwise.
	Subject string `json:"subject,omitempty"`
}

// SourceCount counts the counter decisions of one source and outcome. The zero SourceCount counts
// nothing. It is a plain value, the caller's once returned: safe to copy and to read from any
// goroutine.
type SourceCount struct {
	Source  string `json:"source"`
	Outcome string `json:"outcome"`
	N       int64  `json:"n"`
}

// Snapshot is what the window holds over a span ending now: what the dashboard draws. The zero
// Snapshot is empty. It is a plain value, the caller's once returned: safe to copy and to read from
// any goroutine.
type Snapshot struct {
	Instance string        `json:"instance"`
	Now      time.Time     `json:"now"`
	Span     time.Duration `json:"span"`    // the span covered
	Seconds  []Second      `json:"seconds"` // per second, oldest first
	Sum      Second        `json:"sum"`     // the seconds added up
	Totals   Totals        `json:"totals"`  // since the Observer was created
	Denied   []DenyCount   `json:"denied"`  // by route, rule and tier, most first
	TopKeys  []KeyCount    `json:"topKeys"` // the most denied hashed keys, at most 10
	// UntrackedKeys counts the denials whose key was not tracked: past maxSlotKeys (128) distinct
	// keys denied in one second, later ones are only counted.
	UntrackedKeys int64         `json:"untrackedKeys"`
	Sources       []SourceCount `json:"sources"` // counter decisions by source and outcome
	Health        Health        `json:"health"`
	// Trend is the span's checks and denials per rule, in about 30 steps of TrendStep(Span).
	Trend Trend `json:"trend"`
}

// Health is the state of the Redis paths, when the wrapped Checker is a *policy.Enforcer. The zero
// Health has no limiters and OK false. It is a plain value, the caller's once returned: safe to
// copy and to read from any goroutine.
type Health struct {
	// Limiters are the hybrid limiters: the Enforcer's one, once a policy with hybrid rules is set.
	Limiters []LimiterHealth `json:"limiters"`
	// Strict is the strict rules' client; nil when unknown.
	Strict *policy.StrictHealth `json:"strict,omitempty"`
	// OK reports that every circuit breaker is closed.
	OK bool `json:"ok"`
}

// LimiterHealth is the Redis side of one hybrid limiter. The zero LimiterHealth is empty. It is a
// plain value, the caller's once returned: safe to copy and to read from any goroutine.
type LimiterHealth struct {
	FailurePolicy string `json:"failurePolicy"` // the limiter's default failure policy: "local-fallback", ...
	Breaker       string `json:"breaker"`       // its circuit breaker: "closed", "open" or "half-open"
	RedisCommands int64  `json:"redisCommands"` // script calls sent
	RedisErrors   int64  `json:"redisErrors"`   // calls that failed
	RedisRejected int64  `json:"redisRejected"` // calls not sent: breaker open
	Flushes       int64  `json:"flushes"`       // reconcile rounds
	Pending       int64  `json:"pending"`       // keys with consumption not yet in Redis
	Keys          int    `json:"keys"`          // keys in local memory
}

// Snapshot returns the window's content over the last span (whole seconds, at most the window of WithWindow;
// 0 means all of it). It does no I/O.
func (o *Observer) Snapshot(span time.Duration) Snapshot {
	now := o.cfg.Now()
	secs := o.win.seconds(now)
	if n := int(span / time.Second); n > 0 && n < len(secs) {
		secs = secs[len(secs)-n:]
	}
	s := Snapshot{Instance: o.cfg.Instance, Now: now, Span: time.Duration(len(secs)) * time.Second, Seconds: secs}
	from := secs[0].Unix
	groups := map[group]int64{}
	keys := map[KeyCount]int64{}
	sources := map[SourceCount]int64{}
	for _, c := range secs {
		s.Sum.Allowed += c.Allowed
		s.Sum.Denied += c.Denied
		s.Sum.ShadowDenied += c.ShadowDenied
		s.Sum.Errors += c.Errors
	}
	for i := range o.win.slots {
		sl := &o.win.slots[i]
		sl.mu.Lock()
		if sl.sec >= from && sl.sec <= now.Unix() {
			for g, n := range sl.groups {
				groups[g] += n
			}
			for k, n := range sl.keys {
				keys[k] += n
			}
			for k, n := range sl.sources {
				sources[k] += n
			}
		}
		sl.mu.Unlock()
	}
	s.Totals = Totals{Allowed: o.win.allowed.Load(), Denied: o.win.denied.Load(),
		ShadowDenied: o.win.shadowDenied.Load(), Errors: o.win.errs.Load()}
	spanSec := max(s.Span.Seconds(), 1)
	for g, n := range groups {
		s.Denied = append(s.Denied, DenyCount{Route: g.Route, Rule: g.Rule, Tier: g.Tier, Shadow: g.Shadow, N: n,
			Rate: float64(n) / spanSec})
	}
	sort.Slice(s.Denied, func(i, j int) bool {
		a, b := s.Denied[i], s.Denied[j]
		if a.N != b.N {
			return a.N > b.N
		}
		return a.Route+"\x00"+a.Rule+"\x00"+a.Tier < b.Route+"\x00"+b.Rule+"\x00"+b.Tier
	})
	for k, n := range keys {
		if k.Key == Other {
			s.UntrackedKeys += n
			continue
		}
		k.N = n
		s.TopKeys = append(s.TopKeys, k)
	}
	sort.Slice(s.TopKeys, func(i, j int) bool {
		a, b := s.TopKeys[i], s.TopKeys[j]
		if a.N != b.N {
			return a.N > b.N
		}
		return a.Key+a.Rule < b.Key+b.Rule
	})
	if len(s.TopKeys) > 10 {
		s.TopKeys = s.TopKeys[:10]
	}
	o.reveal.annotate(s.TopKeys)
	for k, n := range sources {
		k.N = n
		s.Sources = append(s.Sources, k)
	}
	sort.Slice(s.Sources, func(i, j int) bool {
		a, b := s.Sources[i], s.Sources[j]
		return a.Source+a.Outcome < b.Source+b.Outcome
	})
	s.Health = o.Health()
	step := TrendStep(s.Span)
	s.Trend = o.win.trend(now, step, int((s.Span+step-1)/step))
	return s
}

// Health returns the state of the Redis paths of the wrapped Checker when it implements
// [HealthReporter] (a *policy.Enforcer does), and an empty, OK Health for any other Checker.
func (o *Observer) Health() Health {
	h := Health{OK: true}
	enf, ok := o.c.(HealthReporter)
	if !ok {
		return h
	}
	if l := enf.Limiter(); l != nil {
		st := l.Stats()
		h.Limiters = append(h.Limiters, LimiterHealth{FailurePolicy: l.FailurePolicy().String(), Breaker: st.Breaker,
			RedisCommands: st.RedisCommands, RedisErrors: st.RedisErrors, RedisRejected: st.RedisRejected,
			Flushes: st.Flushes, Pending: st.Pending, Keys: st.Keys})
		h.OK = h.OK && st.Breaker == "closed"
	}
	sh := enf.StrictHealth()
	h.Strict = &sh
	h.OK = h.OK && sh.Breaker == "closed"
	return h
}

// topKeys returns the n most denied hashed keys of the window's seconds from from to now (keys past
// the per-second cap not included). Subject is left empty: what is published never carries it.
func (o *Observer) topKeys(from, now time.Time, n int) []KeyCount {
	keys := map[KeyCount]int64{}
	for i := range o.win.slots {
		sl := &o.win.slots[i]
		sl.mu.Lock()
		if sl.sec >= from.Unix() && sl.sec <= now.Unix() {
			for k, c := range sl.keys {
				if k.Key != Other {
					keys[k] += c
				}
			}
		}
		sl.mu.Unlock()
	}
	out := make([]KeyCount, 0, len(keys))
	for k, c := range keys {
		k.N = c
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.N != b.N {
			return a.N > b.N
		}
		return a.Key+a.Rule < b.Key+b.Rule
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
