package sidecar

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/policy"
)

// errNoConfig is the error of a request that arrives before any configuration loaded.
var errNoConfig = errors.New("sidecar: no rate limit configuration loaded")

// decideUpstream answers req as envoyproxy/ratelimit's service does: each descriptor's limit is the
// one the descriptor tree names (policy.UpstreamConfig.Lookup); limits named in another matched
// limit's replaces are dropped; unlimited ones answer OK with limit_remaining 2³²-1; the others are
// checked, each under its own rule, and answer with the configured limit, the remaining count and
// the time to the end of the epoch-aligned window, in whole seconds.
func (s *Server) decideUpstream(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	cfg := s.cfg.Upstream()
	switch {
	case cfg == nil:
		return nil, errNoConfig
	case req == nil || req.Domain == "":
		return nil, fmt.Errorf("%w: rate limit domain must not be empty", errBadRequest)
	case len(req.Descriptors) == 0:
		return nil, fmt.Errorf("%w: rate limit descriptor list must not be empty", errBadRequest)
	case len(req.Descriptors) > MaxDescriptors:
		return nil, fmt.Errorf("%w: %d descriptors, at most %d", errBadRequest, len(req.Descriptors), MaxDescriptors)
	}
	n := len(req.Descriptors)
	// Room for the usual request (a few descriptors of a few entries) on the stack.
	var matchArr [4]policy.UpstreamMatch
	var foundArr [4]bool
	var hitsArr [4]int64
	var entArr [8]policy.DescriptorEntry
	matches, found, hits := matchArr[:0], foundArr[:0], hitsArr[:0]
	if n > len(matchArr) {
		matches, found, hits = make([]policy.UpstreamMatch, 0, n), make([]bool, 0, n), make([]int64, 0, n)
	}
	matches, found, hits = matches[:n], found[:n], hits[:n]
	var replacing map[string]bool
	ents := entArr[:0]
	for i, d := range req.Descriptors {
		if d == nil || len(d.Entries) > MaxEntries {
			return nil, fmt.Errorf("%w: descriptor %d: want at most %d entries", errBadRequest, i, MaxEntries)
		}
		ents = ents[:0]
		for _, e := range d.Entries {
			ents = append(ents, policy.DescriptorEntry{Key: e.Key, Value: e.Value})
		}
		matches[i], found[i] = cfg.Lookup(req.Domain, ents)
		if st := s.cfg.UpstreamStats; st != nil && !found[i] && !cfg.HasDomain(req.Domain) {
			st.domainNotFound(req.Domain)
		}
		if found[i] {
			for _, r := range matches[i].Limit.Replaces {
				if replacing == nil {
					replacing = map[string]bool{}
				}
				replacing[r] = true
			}
		}
	}
	// hits_addend: the descriptor's (0 checks only), else the request's (0 means 1). Above
	// maxHits a request is over any limit, as upstream answers it; it counts maxHits.
	limited := 0
	for i, d := range req.Descriptors {
		h := max(uint64(req.HitsAddend), 1)
		if d.HitsAddend != nil {
			h = d.HitsAddend.Value
		}
		hits[i] = int64(min(h, maxHits))
		m := matches[i]
		if found[i] && !m.Limit.Unlimited && m.Limit.Name != "" && replacing[m.Limit.Name] {
			found[i] = false
		}
		if found[i] && !m.Limit.Unlimited {
			limited++
		}
	}
	if s.cfg.UpstreamStopIncrement && limited > 1 {
		if err := s.stopIncrement(ctx, req.Domain, matches, found, hits); err != nil {
			return nil, err
		}
	}
	now := s.cfg.Now()
	resp, sts := newUpstreamResponse(n)
	var minimum *rlsv3.RateLimitResponse_DescriptorStatus
	minRemaining := uint32(math.MaxUint32)
	for i := range req.Descriptors {
		m := matches[i]
		us := &sts[i]
		st := &us.status
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		switch {
		case !found[i]:
			continue
		case m.Limit.Unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		}
		c, err := s.checkUpstream(ctx, req.Domain, m, hits[i])
		if err != nil {
			return nil, fmt.Errorf("sidecar: descriptor %d: %w", i, err)
		}
		if !c.ok {
			continue // the rule went away in a reload between the lookup and the check: no limit
		}
		over, remaining := c.over, c.remaining
		if st := s.cfg.UpstreamStats; st != nil {
			after := uint64(m.Limit.RequestsPerUnit) - uint64(min(max(remaining, 0), int64(m.Limit.RequestsPerUnit)))
			if over {
				after = uint64(m.Limit.RequestsPerUnit) + uint64(max(c.excess, 0))
			}
			st.record(m, s.cfg.UpstreamNearLimitRatio, uint64(hits[i]), after, over)
		}
		secs := int64(m.Period.Seconds())
		us.limit.Name, us.limit.RequestsPerUnit, us.limit.Unit = m.Limit.Name, m.Limit.RequestsPerUnit, unitOf(m.Limit.Unit)
		us.reset.Seconds = secs - now.Unix()%secs
		st.CurrentLimit, st.DurationUntilReset = &us.limit, &us.reset
		if !over {
			st.LimitRemaining = uint32(min(max(remaining, 0), math.MaxUint32))
		}
		if st.LimitRemaining < minRemaining {
			minimum, minRemaining = st, st.LimitRemaining
		}
		if over && !m.Shadow {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			minimum, minRemaining = st, 0
		}
	}
	if h := s.cfg.UpstreamHeaders; h != nil && minimum != nil {
		secs := minimum.DurationUntilReset.GetSeconds()
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			header(h.Limit, strconv.FormatUint(uint64(minimum.CurrentLimit.RequestsPerUnit), 10)),
			header(h.Remaining, strconv.FormatUint(uint64(minimum.LimitRemaining), 10)),
			header(h.Reset, strconv.FormatInt(secs, 10)))
	}
	if s.cfg.UpstreamShadow {
		resp.OverallCode = rlsv3.RateLimitResponse_OK
	}
	return resp, nil
}

// upstreamStatus is one descriptor's status in an answer in upstream's terms, with the messages it
// points to: one allocation where there would be three.
type upstreamStatus struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// singleResponse is the answer to a request of one descriptor, in one allocation.
type singleResponse struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	status   [1]upstreamStatus
}

// newUpstreamResponse returns an OK response with room for n statuses (resp.Statuses has length n,
// every element nil) and the n statuses to fill in.
func newUpstreamResponse(n int) (*rlsv3.RateLimitResponse, []upstreamStatus) {
	if n == 1 {
		r := &singleResponse{}
		r.resp.OverallCode, r.resp.Statuses = rlsv3.RateLimitResponse_OK, r.statuses[:]
		return &r.resp, r.status[:]
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}, make([]upstreamStatus, n)
}

// unitOf is the protobuf enum of a rate_limit unit as upstream's configuration spells it (any case;
// UNKNOWN for another word).
func unitOf(unit string) rlsv3.RateLimitResponse_RateLimit_Unit {
	switch unit { // the usual spellings, without ToUpper's copy
	case "second":
		return rlsv3.RateLimitResponse_RateLimit_SECOND
	case "minute":
		return rlsv3.RateLimitResponse_RateLimit_MINUTE
	case "hour":
		return rlsv3.RateLimitResponse_RateLimit_HOUR
	case "day":
		return rlsv3.RateLimitResponse_RateLimit_DAY
	}
	return rlsv3.RateLimitResponse_RateLimit_Unit(rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(unit)])
}

// maxHits is the most hits one descriptor counts: strict.MaxLimit, above every limit.
const maxHits = 1_000_000_000

// stopIncrement applies STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT as upstream's Redis cache does: it
// reads every limited descriptor's count, and when the request's hits would take one or more of them
// over their limits, only those count their hits (upstream increments those and reads the others);
// hits of the others are set to 0. Like upstream's GET then INCRBY, the read and the charge are
// separate calls.
func (s *Server) stopIncrement(ctx context.Context, domain string, matches []policy.UpstreamMatch, found []bool, hits []int64) error {
	wouldOver := make([]bool, len(hits))
	some := false
	for i, m := range matches {
		if !found[i] || m.Limit.Unlimited {
			continue
		}
		c, err := s.checkUpstream(ctx, domain, m, 0)
		if err != nil {
			return fmt.Errorf("sidecar: descriptor %d: %w", i, err)
		}
		wouldOver[i] = c.ok && (c.over || hits[i] > c.remaining)
		some = some || wouldOver[i]
	}
	if some {
		for i := range hits {
			if !wouldOver[i] {
				hits[i] = 0
			}
		}
	}
	return nil
}

// upstreamCall is the request checkUpstream makes of the Checker, with its storage.
type upstreamCall struct {
	pr   policy.Request
	dims subjectDims
	dec  [1]policy.Decision
}

// subjectDims is a matched descriptor's one dimension: policy.DimDescriptor, its subject.
type subjectDims struct{ subject string }

// Dimension returns the subject for policy.DimDescriptor; there is no other dimension.
func (d *subjectDims) Dimension(name string) (string, bool) {
	if name == policy.DimDescriptor {
		return d.subject, true
	}
	return "", false
}

// upstreamCheck is the outcome of charging a descriptor's hits to its limit.
type upstreamCheck struct {
	over      bool  // the limit is exceeded
	remaining int64 // what is left, when not over
	excess    int64 // how far the count is above the limit, when over (upstream_window rules)
	ok        bool  // false when the policy in force no longer has the rule
}

// checkUpstream charges hits to a matched limit (a limit of 0 per unit is always over, unless hits
// is 0).
func (s *Server) checkUpstream(ctx context.Context, domain string, m policy.UpstreamMatch, hits int64) (upstreamCheck, error) {
	if m.Rule == "" { // requests_per_unit: 0
		return upstreamCheck{over: hits > 0, excess: hits, ok: true}, nil
	}
	// The request, its one dimension and room for its decision: one allocation.
	c := &upstreamCall{dims: subjectDims{subject: m.Subject}}
	c.pr = policy.Request{Domain: domain, Rule: m.Rule, Dims: &c.dims, Cost: hits, CheckOnly: hits == 0, Decisions: c.dec[:0]}
	res, err := s.cfg.Checker.Check(ctx, &c.pr)
	if errors.Is(err, policy.ErrInvalidCost) {
		// More hits than the limit under an algorithm that refuses them uncounted: over it, as
		// upstream answers.
		return upstreamCheck{over: true, excess: hits - int64(m.Limit.RequestsPerUnit), ok: true}, nil
	}
	if err != nil {
		return upstreamCheck{}, err
	}
	for _, d := range res.Decisions {
		if d.Rule == m.Rule {
			c := upstreamCheck{over: !d.Allowed, remaining: d.Remaining, excess: d.Excess, ok: true}
			if d.Source == outcome.SourceMemo {
				// A remembered denial: the count was above the limit before these hits, which
				// upstream would have counted on top (its exact value is not known here).
				c.excess = max(c.excess, hits)
			}
			return c, nil
		}
	}
	if hits == 0 {
		return upstreamCheck{over: !res.Allowed, ok: true}, nil
	}
	return upstreamCheck{}, nil
}
