package observe

import (
	"sort"
	"time"
)

// Trend is a short time series of checks and denials, per rule, in steps aligned on Unix time (a
// step of 10s starts at a multiple of 10s), so that the trends of several instances add up step by
// step. The zero Trend has no steps. It is a plain value, the caller's once returned: safe to copy
// and to read from any goroutine.
type Trend struct {
	Start  int64       `json:"start"`  // the Unix second the first step starts at
	Step   int64       `json:"step"`   // the step, in seconds
	Checks []int64     `json:"checks"` // checks per step (admitted and denied), oldest first
	Denied []int64     `json:"denied"` // denials per step (shadow would-be denials not included)
	Rules  []RuleTrend `json:"rules"`  // denials per rule and step, most denied first
}

// RuleTrend is one rule's denials per step of a [Trend]. The zero RuleTrend is empty. It is a plain
// value, the caller's once returned: safe to copy and to read from any goroutine.
type RuleTrend struct {
	Rule   string  `json:"rule"`
	Shadow bool    `json:"shadow"` // would-be denials: the requests were admitted
	N      int64   `json:"n"`      // the steps added up
	Series []int64 `json:"series"` // per step, oldest first
}

// maxTrendRules bounds the rules of a Trend; the least denied beyond it are added up as Other.
const maxTrendRules = 32

// TrendStep returns the step a Snapshot's Trend uses for span: about 30 steps, at least 1s.
func TrendStep(span time.Duration) time.Duration {
	return max(time.Second, ((span + 29*time.Second) / 30).Truncate(time.Second))
}

// Trend returns the window's checks and denials per rule over the last points steps of step
// (whole seconds, at least 1s; the window's length bounds how far back it reaches). The last step
// is the one now is in, so far. It does no I/O.
func (o *Observer) Trend(step time.Duration, points int) Trend {
	return o.win.trend(o.cfg.Now(), step, points)
}

type ruleShadow struct {
	rule   string
	shadow bool
}

func (w *window) trend(now time.Time, step time.Duration, points int) Trend {
	st := max(int64(step/time.Second), 1)
	points = max(points, 1)
	end := now.Unix()
	start := (end/st - int64(points) + 1) * st
	t := Trend{Start: start, Step: st, Checks: make([]int64, points), Denied: make([]int64, points)}
	rules := map[ruleShadow][]int64{}
	for i := range w.slots {
		sl := &w.slots[i]
		sl.mu.Lock()
		if sl.sec >= start && sl.sec <= end {
			b := (sl.sec - start) / st
			t.Checks[b] += sl.counts.Allowed + sl.counts.Denied
			t.Denied[b] += sl.counts.Denied
			for g, n := range sl.groups {
				k := ruleShadow{g.Rule, g.Shadow}
				s := rules[k]
				if s == nil {
					s = make([]int64, points)
					rules[k] = s
				}
				s[b] += n
			}
		}
		sl.mu.Unlock()
	}
	for k, s := range rules {
		var n int64
		for _, v := range s {
			n += v
		}
		t.Rules = append(t.Rules, RuleTrend{Rule: k.rule, Shadow: k.shadow, N: n, Series: s})
	}
	t.Rules = capRules(t.Rules, maxTrendRules)
	return t
}

// sortRules orders rules by denials, most first, then by name.
func sortRules(rs []RuleTrend) {
	sort.Slice(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if a.N != b.N {
			return a.N > b.N
		}
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		return !a.Shadow && b.Shadow
	})
}

// capRules sorts rs and adds up those past the first n (less one) into one Other rule.
func capRules(rs []RuleTrend, n int) []RuleTrend {
	sortRules(rs)
	if len(rs) <= n {
		return rs
	}
	other := RuleTrend{Rule: Other, Series: make([]int64, len(rs[0].Series))}
	for _, r := range rs[n-1:] {
		other.N += r.N
		for i, v := range r.Series {
			other.Series[i] += v
		}
	}
	return append(rs[:n-1:n-1], other)
}
