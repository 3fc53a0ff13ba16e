package sidecar_test

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/policy/policytest"
	"github.com/hybridrate/hybridrate/sidecar"
)

const upstreamYAML = `domain: rl
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2, name: specific, replaces: [{name: general}]}
  - key: g
    rate_limit: {unit: hour, requests_per_unit: 5, name: general}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: never
    rate_limit: {unit: day, requests_per_unit: 0}
`

func newUpstreamServer(t *testing.T, headers *sidecar.HeaderNames, now time.Time) *sidecar.Server {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t, redistest.NoRetries)
	enf := policytest.NewEnforcer(t, rdb, policy.WithStrictTimeout(time.Second))
	cfg := policytest.Upstream(t, "config/rl.yaml", upstreamYAML)
	require.NoError(t, enf.SetPolicy(cfg.Policy()))
	s, err := sidecar.New(
		enf,
		sidecar.WithUpstream(func() *policy.UpstreamConfig { return cfg }),
		sidecar.WithUpstreamHeaders(headers),
		sidecar.WithClock(func() time.Time { return now }),
	)
	require.NoError(t, err)
	return s
}

func TestUpstreamAnswersAsEnvoyRatelimit(t *testing.T) {
	now := time.Unix(1_700_000_000+17, 0) // 37 s into a minute (1_700_000_000 % 60 == 20)
	s := newUpstreamServer(t, &sidecar.DefaultHeaderNames, now)
	ctx := context.Background()
	ask := func(ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: ds})
		require.NoError(t, err)
		return resp
	}
	minuteLeft := int64(60 - now.Unix()%60)

	// Two per minute, then OVER_LIMIT with remaining 0; reset in whole seconds to the epoch-aligned window's end.
	for i, want := range []uint32{1, 0} {
		r := ask(desc("k", "a"))
		require.Equal(t, rlsv3.RateLimitResponse_OK, r.OverallCode, "request %d", i)
		st := r.Statuses[0]
		require.Equal(t, want, st.LimitRemaining)
		require.Equal(t, uint32(2), st.CurrentLimit.RequestsPerUnit)
		require.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, st.CurrentLimit.Unit)
		require.Equal(t, "specific", st.CurrentLimit.Name)
		require.Equal(t, minuteLeft, st.DurationUntilReset.Seconds)
	}
	r := ask(desc("k", "a"))
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.Statuses[0].Code)
	require.Zero(t, r.Statuses[0].LimitRemaining)
	require.Equal(t, map[string]string{"RateLimit-Limit": "2", "RateLimit-Remaining": "0", "RateLimit-Reset": itoa(minuteLeft)}, headers(r))

	// replaces: "specific" matched in the same request drops "general", which is not counted.
	r = ask(desc("k", "b"), desc("g", "x"))
	require.Nil(t, r.Statuses[1].CurrentLimit)
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.Statuses[1].Code)
	r = ask(desc("g", "x"))
	require.Equal(t, uint32(4), r.Statuses[0].LimitRemaining, "general counted once, not twice")

	// unlimited, unmatched, shadow, 0 per unit.
	r = ask(desc("free", "x"), desc("nothing", "x"))
	require.Equal(t, uint32(math.MaxUint32), r.Statuses[0].LimitRemaining)
	require.Nil(t, r.Statuses[0].CurrentLimit)
	require.Nil(t, r.Statuses[1].CurrentLimit)
	require.Zero(t, r.Statuses[1].LimitRemaining)
	require.Empty(t, r.ResponseHeadersToAdd, "no header without a limit")
	ask(desc("shadow", "x"))
	r = ask(desc("shadow", "x"))
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.OverallCode, "shadow_mode never denies")
	require.Zero(t, r.Statuses[0].LimitRemaining)
	r = ask(desc("never", "x"))
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Equal(t, uint32(0), r.Statuses[0].CurrentLimit.RequestsPerUnit)

	// hits_addend above the limit: over, as upstream answers (not a bad request).
	resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: desc("k", "c").Entries, HitsAddend: wrapperspb.UInt64(3)}}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.OverallCode)

	// An unknown domain is not limited; an empty one is an error.
	r, err = s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "a")}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.OverallCode)
	_, err = s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "a")}})
	require.ErrorContains(t, err, "rate limit domain must not be empty")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestUpstreamManyDescriptors sends more descriptors than decideUpstream keeps on its stack (4): each
// status is its own, in the request's order.
func TestUpstreamManyDescriptors(t *testing.T) {
	now := time.Unix(1_700_000_000+17, 0)
	s := newUpstreamServer(t, nil, now)
	ds := []*rlv3.RateLimitDescriptor{desc("k", "m1"), desc("g", "m2"), desc("free", "m3"), desc("nothing", "m4"),
		desc("k", "m5"), desc("never", "m6")}
	r, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: ds})
	require.NoError(t, err)
	require.Len(t, r.Statuses, len(ds))
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.OverallCode, "never: 0 per day")
	limits := make([]uint32, len(ds))
	for i, st := range r.Statuses {
		for j := range i {
			require.NotSame(t, r.Statuses[j], st, "statuses %d and %d", j, i)
		}
		limits[i] = st.GetCurrentLimit().GetRequestsPerUnit()
	}
	// "general" (g) is replaced by "specific" (k) in the same request: no limit; free and nothing: none.
	require.Equal(t, []uint32{2, 0, 0, 0, 2, 0}, limits)
	require.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, r.Statuses[4].CurrentLimit.Unit)
	require.Equal(t, rlsv3.RateLimitResponse_RateLimit_DAY, r.Statuses[5].CurrentLimit.Unit)
	require.Equal(t, uint32(math.MaxUint32), r.Statuses[2].LimitRemaining)
	require.Equal(t, uint32(1), r.Statuses[0].LimitRemaining)
	require.Equal(t, uint32(1), r.Statuses[4].LimitRemaining)
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.Statuses[5].Code)
}
