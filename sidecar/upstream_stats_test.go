package sidecar

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/hybridrate/hybridrate/policy"
)

// TestUpstreamStatsCountsAsUpstream replays answers whose statistics envoyproxy/ratelimit was seen
// to export (v1.4.1-0.20260122083618-3fb702589d36, NEAR_LIMIT_RATIO 0.8, scraped from its
// Prometheus sink): two values under one stats key of 5 per hour, and a shadow limit of 1.
func TestUpstreamStatsCountsAsUpstream(t *testing.T) {
	t.Parallel()
	var s UpstreamStats
	a := policy.UpstreamMatch{Metric: "d.a", Limit: &policy.UpstreamLimit{RequestsPerUnit: 5}}
	for i := uint64(1); i <= 7; i++ { // value x, 1 hit each: the count after is i
		s.record(a, 0.8, 1, i, i > 5)
	}
	s.record(a, 0.8, 3, 3, false) // value y, 3 hits
	s.record(a, 0.8, 3, 6, true)
	m := policy.UpstreamMatch{Metric: "d.m.n.o", Shadow: true, Limit: &policy.UpstreamLimit{RequestsPerUnit: 1}}
	for i := uint64(1); i <= 7; i++ {
		s.record(m, 0.8, 1, i, i > 1)
	}
	got := map[string][5]uint64{}
	s.Range(func(key string, l *LimitStats) bool {
		got[key] = [5]uint64{l.TotalHits.Load(), l.OverLimit.Load(), l.NearLimit.Load(), l.WithinLimit.Load(), l.ShadowMode.Load()}
		return true
	})
	// total_hits, over_limit, near_limit, within_limit, shadow_mode, as upstream exported them.
	assert.Equal(t, map[string][5]uint64{"d.a": {13, 3, 2, 8, 0}, "d.m.n.o": {7, 6, 1, 1, 6}}, got)
}
