package sidecar

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/hybridrate/hybridrate/policy"
)

// MaxUpstreamStatKeys bounds the limits [UpstreamStats] keeps: with detailed_metric or
// value_to_metric a stats key holds request values, so their number is the callers' to choose.
// Hits of keys beyond the bound are counted in no key (UpstreamStats.Dropped).
const MaxUpstreamStatKeys = 1 << 16

// UpstreamStats counts, per limit, what envoyproxy/ratelimit's base limiter counts: total_hits,
// over_limit, near_limit, within_limit and shadow_mode, with the same arithmetic (a request of N
// hits that crosses the limit counts the hits above it as over_limit and those between the
// near-limit threshold and the limit as near_limit). Keys are upstream's stats keys
// ([policy.UpstreamMatch] Metric: "domain.key_value.key", or the request's values with
// detailed_metric and value_to_metric). Package main exports them under upstream's Prometheus
// names. The zero UpstreamStats is empty and ready; it is safe for concurrent use.
type UpstreamStats struct {
	keys sync.Map // stats key → *LimitStats
	n    atomic.Int64
	// Dropped counts the hits of keys beyond MaxUpstreamStatKeys.
	Dropped atomic.Uint64
	// DomainNotFound counts requests of a domain no configuration file names, by domain.
	domains sync.Map // domain → *atomic.Uint64
	nd      atomic.Int64
}

// LimitStats are the counters of one stats key. They are live counters, not a snapshot
// (UpstreamStats hands out the ones it updates): read them with Load; safe for concurrent use. The
// zero LimitStats counts nothing.
type LimitStats struct {
	TotalHits, OverLimit, NearLimit, WithinLimit, ShadowMode atomic.Uint64
}

// Range calls fn for each stats key, in no particular order, until fn returns false.
func (s *UpstreamStats) Range(fn func(key string, l *LimitStats) bool) {
	s.keys.Range(func(k, v any) bool { return fn(k.(string), v.(*LimitStats)) })
}

// RangeDomainNotFound calls fn for each unknown domain with its request count.
func (s *UpstreamStats) RangeDomainNotFound(fn func(domain string, n uint64) bool) {
	s.domains.Range(func(k, v any) bool { return fn(k.(string), v.(*atomic.Uint64).Load()) })
}

func (s *UpstreamStats) limit(key string) *LimitStats {
	if v, ok := s.keys.Load(key); ok {
		return v.(*LimitStats)
	}
	if s.n.Load() >= MaxUpstreamStatKeys {
		return nil
	}
	v, loaded := s.keys.LoadOrStore(key, new(LimitStats))
	if !loaded {
		s.n.Add(1)
	}
	return v.(*LimitStats)
}

func (s *UpstreamStats) domainNotFound(domain string) {
	if v, ok := s.domains.Load(domain); ok {
		v.(*atomic.Uint64).Add(1)
		return
	}
	if s.nd.Load() >= MaxUpstreamStatKeys {
		return
	}
	v, loaded := s.domains.LoadOrStore(domain, new(atomic.Uint64))
	if !loaded {
		s.nd.Add(1)
	}
	v.(*atomic.Uint64).Add(1)
}

// record counts one descriptor's answer as upstream's GetResponseDescriptorStatus does: hits were
// charged to m's limit, whose count is now after (over: after is above the limit).
func (s *UpstreamStats) record(m policy.UpstreamMatch, nearRatio float32, hits, after uint64, over bool) {
	l := s.limit(m.Metric)
	if l == nil {
		s.Dropped.Add(hits)
		return
	}
	limit := uint64(m.Limit.RequestsPerUnit)
	near := uint64(math.Floor(float64(float32(limit) * nearRatio)))
	before := after - min(hits, after)
	l.TotalHits.Add(hits)
	if over {
		if before >= limit {
			l.OverLimit.Add(hits)
		} else {
			l.OverLimit.Add(after - limit)
			l.NearLimit.Add(limit - max(near, before))
		}
		if m.Shadow {
			if before >= limit {
				l.ShadowMode.Add(hits)
			} else {
				l.ShadowMode.Add(after - limit)
			}
		}
		return
	}
	if after > near {
		if before >= near {
			l.NearLimit.Add(hits)
		} else {
			l.NearLimit.Add(after - near)
		}
	}
	l.WithinLimit.Add(hits)
}
