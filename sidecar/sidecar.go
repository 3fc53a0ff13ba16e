package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/policy"
)

const instrumentationName = "github.com/hybridrate/hybridrate/sidecar"

// Limits of a request.
const (
	// MaxDescriptors is the most descriptors one request may carry.
	MaxDescriptors = 64
	// MaxEntries is the most entries one descriptor may carry.
	MaxEntries = 16
	// MaxBody is the largest JSON request body, in bytes.
	MaxBody = 64 << 10
	// HitsCostName is the name under which [HitsCost] is registered in policy.WithCostFuncs.
	HitsCostName = "hits_addend"
)

// config is a Server's settings: Checker from New, the rest from its options (options.go); the
// zero values stand for the defaults New fills in.
type config struct {
	Checker                policy.Checker
	Keys                   map[string]string             // WithKeys
	MeterProvider          metric.MeterProvider          // WithMeterProvider
	Instance               string                        // WithInstance
	Upstream               func() *policy.UpstreamConfig // WithUpstream
	UpstreamShadow         bool                          // WithUpstreamShadow
	UpstreamHeaders        *HeaderNames                  // WithUpstreamHeaders
	UpstreamStopIncrement  bool                          // WithUpstreamStopIncrement
	UpstreamStats          *UpstreamStats                // WithUpstreamStats
	UpstreamNearLimitRatio float32                       // WithUpstreamNearLimitRatio
	Now                    func() time.Time              // WithClock
}

// HeaderNames are the names of upstream's optional response headers. The zero HeaderNames names no
// header. It is a plain value, safe to copy and share.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

// DefaultHeaderNames are upstream's defaults (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER,
// LIMIT_RESET_HEADER).
var DefaultHeaderNames = HeaderNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}

// Server answers rate-limit requests with a policy. Create it with [New]. It implements Envoy's
// RateLimitServiceServer; it is safe for concurrent use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cfg  config
	keys map[string]string
	reqs metric.Int64Counter
	lat  metric.Float64Histogram
	opts [2][5]measureOpts // by API (apiGRPC, apiHTTP) and code (codeOK, …; codeNone for the latency histogram)
	inst attribute.KeyValue
}

var _ rlsv3.RateLimitServiceServer = (*Server)(nil)

// New returns a Server that decides with c (an *observe.Observer or a *policy.Enforcer), configured
// by opts. It does no I/O. Errors: a nil Checker or an invalid option (wrapping [ErrBadOption]), or
// the meter provider's error creating an instrument.
func New(c policy.Checker, opts ...Option) (*Server, error) {
	if c == nil {
		return nil, badOption("nil Checker")
	}
	cfg := config{Checker: c}
	if err := option.Apply(&cfg, ErrBadOption, opts); err != nil {
		return nil, err
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.Instance == "" {
		cfg.Instance = hybrid.DefaultInstance()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	keys := map[string]string{"remote_address": policy.DimIP}
	for k, v := range cfg.Keys {
		keys[k] = v
	}
	s := &Server{cfg: cfg, keys: keys, inst: attribute.String("hybridrate.instance", cfg.Instance)}
	m := cfg.MeterProvider.Meter(instrumentationName)
	var err1, err2 error
	s.reqs, err1 = m.Int64Counter("hybridrate.sidecar.requests",
		metric.WithDescription("Rate-limit requests, by API (grpc, http) and overall code (OK, OVER_LIMIT; bad_request: a malformed request, an unknown domain or a cost above a rule's limit; error: no decision could be made)."))
	s.lat, err2 = m.Float64Histogram("hybridrate.sidecar.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to answer a rate-limit request, all descriptors, by API."),
		metric.WithExplicitBucketBoundaries(1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1))
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("sidecar: %w", err)
	}
	for a, api := range apiNames {
		for c, code := range codeNames {
			kv := []attribute.KeyValue{s.inst, attribute.String("api", api)}
			if code != "" {
				kv = append(kv, attribute.String("code", code))
			}
			s.opts[a][c] = newMeasureOpts(metric.WithAttributeSet(attribute.NewSet(kv...)))
		}
	}
	return s, nil
}

// The APIs and codes of the sidecar's metrics, as indexes of Server.opts (an array lookup where a
// map keyed by the names would hash two strings per request).
const (
	apiGRPC = iota
	apiHTTP
)

const (
	codeOK = iota
	codeOverLimit
	codeBadRequest
	codeError
	codeNone // the latency histogram's attributes: no code
)

var (
	apiNames  = [...]string{apiGRPC: "grpc", apiHTTP: "http"}
	codeNames = [...]string{codeOK: "OK", codeOverLimit: "OVER_LIMIT", codeBadRequest: "bad_request", codeError: "error", codeNone: ""}
)

// measureOpts is one attribute set as the option lists of a counter's Add and a histogram's Record,
// built once: a list built at each call is an allocation.
type measureOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newMeasureOpts(o metric.MeasurementOption) measureOpts {
	return measureOpts{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}

// Register registers the Server as the RateLimitService of gs. It does no I/O.
func (s *Server) Register(gs grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(gs, s) }

// ShouldRateLimit answers one request of Envoy's rate-limit filter. Its I/O is the Checker's (per
// descriptor). A denial is not an error; errors are gRPC statuses from [policy.ErrorStatus]:
// InvalidArgument for a malformed request or an unknown domain, Canceled when ctx was cancelled,
// otherwise Unavailable.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := s.decide(ctx, apiGRPC, req)
	if err != nil {
		return nil, status.Error(grpcCode(err), err.Error())
	}
	return resp, nil
}

// grpcCode is policy.ErrorStatus in gRPC's terms: 400 InvalidArgument, 499 Canceled, 503 Unavailable.
func grpcCode(err error) codes.Code {
	switch policy.ErrorStatus(err) {
	case http.StatusBadRequest:
		return codes.InvalidArgument
	case policy.StatusClientClosedRequest:
		return codes.Canceled
	}
	return codes.Unavailable
}

// errBadRequest is wrapped by the errors of a malformed request; it matches policy.ErrBadRequest.
var errBadRequest = fmt.Errorf("sidecar: %w", policy.ErrBadRequest)

// decide checks every descriptor of req.
func (s *Server) decide(ctx context.Context, api int, req *rlsv3.RateLimitRequest) (resp *rlsv3.RateLimitResponse, err error) {
	start := time.Now()
	defer func() {
		code := codeError
		switch {
		case err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
			code = codeOverLimit
		case err == nil:
			code = codeOK // the only other overall code either API answers
		case errors.Is(err, errBadRequest):
			code = codeBadRequest
		}
		s.reqs.Add(ctx, 1, s.opts[api][code].add...)
		s.lat.Record(ctx, time.Since(start).Seconds(), s.opts[api][codeNone].rec...)
	}()
	if s.cfg.Upstream != nil {
		return s.decideUpstream(ctx, req)
	}
	switch {
	case req == nil || len(req.Descriptors) == 0:
		return nil, fmt.Errorf("%w: no descriptors", errBadRequest)
	case len(req.Descriptors) > MaxDescriptors:
		return nil, fmt.Errorf("%w: %d descriptors, at most %d", errBadRequest, len(req.Descriptors), MaxDescriptors)
	}
	resp = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	var worst *policy.Decision
	var worstDenied bool
	var retry time.Duration
	for i, d := range req.Descriptors {
		if d == nil || len(d.Entries) == 0 || len(d.Entries) > MaxEntries {
			return nil, fmt.Errorf("%w: descriptor %d: want 1 to %d entries", errBadRequest, i, MaxEntries)
		}
		// Envoy's hits_addend: the request's, where 0 (unset) means 1; a descriptor's own, where 0
		// means check only.
		hits := max(uint64(req.HitsAddend), 1)
		if d.HitsAddend != nil {
			hits = d.HitsAddend.Value
		}
		if hits > math.MaxInt32 {
			return nil, fmt.Errorf("%w: descriptor %d: hits_addend %d too large", errBadRequest, i, hits)
		}
		dims := &descriptor{s: s, d: d, domain: req.Domain, hits: int64(hits)}
		pr := policy.Request{Domain: req.Domain, Dims: dims, Cost: int64(hits), CheckOnly: hits == 0}
		pr.Tier, _ = dims.Dimension("tier")
		pr.Method, _ = dims.Dimension(policy.DimMethod)
		res, err := s.cfg.Checker.Check(ctx, &pr)
		if errors.Is(err, policy.ErrBadRequest) {
			// The caller's domain or hits_addend: a bad request, not a limiter failure.
			return nil, fmt.Errorf("%w: descriptor %d: %w", errBadRequest, i, err)
		}
		if err != nil {
			return nil, fmt.Errorf("sidecar: descriptor %d: %w", i, err)
		}
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		if !res.Allowed {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			retry = max(retry, res.RetryAfter)
		}
		if p := res.Primary(); p != nil {
			st.CurrentLimit = currentLimit(p)
			st.LimitRemaining = uint32(min(max(p.Remaining, 0), math.MaxUint32))
			st.DurationUntilReset = durationpb.New(p.ResetAfter)
			// The most constrained descriptor: a denied one first, then the least remaining.
			if worst == nil || (!res.Allowed && !worstDenied) ||
				(!res.Allowed == worstDenied && p.Remaining < worst.Remaining) {
				worst, worstDenied = p, !res.Allowed
			}
		}
		resp.Statuses[i] = st
	}
	if worst != nil {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			header("X-RateLimit-Limit", strconv.FormatInt(worst.Limit, 10)),
			header("X-RateLimit-Remaining", strconv.FormatInt(max(worst.Remaining, 0), 10)),
			header("X-RateLimit-Reset", strconv.FormatInt(worst.ResetSeconds(), 10)))
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			header("Retry-After", strconv.FormatInt(policy.RetryAfterSeconds(retry), 10)))
	}
	return resp, nil
}

func header(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, Value: v} }

var units = []struct {
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	d    time.Duration
}{
	{rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
}

// currentLimit expresses d's quota in Envoy's terms: Limit requests per unit_multiplier units, in
// the largest unit that divides the window (100 per 10 seconds, 5 per 1 day); a window that is no
// whole number of seconds (a hybrid bucket's Burst/Rate) is given as the nearest whole rate, at
// least 1, in the smallest unit where it is at least one request.
func currentLimit(d *policy.Decision) *rlsv3.RateLimitResponse_RateLimit {
	name := d.Unit
	if name == "" {
		name = d.Rule
	}
	limit := uint32(min(max(d.Limit, 0), math.MaxUint32))
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: name, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND, RequestsPerUnit: limit}
	if d.Window <= 0 {
		return rl
	}
	for i := len(units) - 1; i >= 0; i-- {
		u := units[i]
		n := math.Round(d.Window.Seconds() / u.d.Seconds())
		// A float window: 59.9999s is a minute.
		if n >= 1 && math.Abs(d.Window.Seconds()-n*u.d.Seconds()) <= u.d.Seconds()/1000 {
			rl.Unit = u.unit
			if n > 1 {
				rl.UnitMultiplier = wrapperspb.UInt32(uint32(min(n, math.MaxUint32)))
			}
			return rl
		}
	}
	perSecond := float64(d.Limit) / d.Window.Seconds()
	for _, u := range units {
		if n := perSecond * u.d.Seconds(); n >= 1 || u.unit == rlsv3.RateLimitResponse_RateLimit_DAY {
			rl.Unit, rl.RequestsPerUnit = u.unit, uint32(min(max(math.Round(n), 1), math.MaxUint32))
			return rl
		}
	}
	return rl
}

// descriptor is one descriptor's dimensions.
type descriptor struct {
	s      *Server
	d      *rlv3.RateLimitDescriptor
	domain string
	hits   int64
}

// Dimension returns the value of the descriptor's first entry that names dimension name.
func (d *descriptor) Dimension(name string) (string, bool) {
	for _, e := range d.d.Entries {
		k := e.Key
		if m, ok := d.s.keys[k]; ok {
			k = m
		}
		if k == name {
			return e.Value, true
		}
	}
	if name == "domain" && d.domain != "" {
		return d.domain, true
	}
	return "", false
}

// HitsCost is a policy.CostFunc that charges a sidecar request's hits_addend (the descriptor's, else
// the request's; 1 when neither is set, and for requests that did not come through a Server).
// Register it in policy.WithCostFuncs under HitsCostName and name it in a rule: `cost: {func:
// hits_addend}`. Rules without a cost of their own charge the same by default (policy.Request.Cost).
func HitsCost(r *policy.Request) int64 {
	if d, ok := r.Dims.(*descriptor); ok && d.hits > 0 {
		return d.hits
	}
	return 1
}

// CheckHandler returns the HTTP form of ShouldRateLimit: POST a RateLimitRequest as JSON (protobuf's
// JSON mapping, e.g. {"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}]})
// and get the RateLimitResponse as JSON, with status 200 when OK and 429 when OVER_LIMIT, and the
// response's headers (X-RateLimit-*, Retry-After) set on the HTTP response too. A malformed request
// gets 400 with the reason in its JSON body ({"error":"bad_request","reason":"descriptor 0: want 1
// to 16 entries"}); a request no decision could be made on gets 503. The handler is safe for
// concurrent use; its I/O is the request body's read and the Checker's.
func (s *Server) CheckHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large")
			return
		case err != nil: // the client's body broke off: nothing to decide on
			s.reqs.Add(r.Context(), 1, s.opts[apiHTTP][codeBadRequest].add...)
			writeReason(w, http.StatusBadRequest, "bad_request", "reading the body: "+err.Error())
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			s.reqs.Add(r.Context(), 1, s.opts[apiHTTP][codeBadRequest].add...)
			writeReason(w, http.StatusBadRequest, "bad_request", "malformed RateLimitRequest JSON: "+err.Error())
			return
		}
		resp, err := s.decide(r.Context(), apiHTTP, &req)
		switch code := policy.ErrorStatus(err); code {
		case http.StatusOK:
		case http.StatusBadRequest:
			writeReason(w, code, "bad_request", strings.TrimPrefix(err.Error(), errBadRequest.Error()+": "))
			return
		default:
			writeError(w, code, errorName(code))
			return
		}
		out, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(resp)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "encode")
			return
		}
		h := w.Header()
		for _, hv := range resp.ResponseHeadersToAdd {
			h.Set(hv.Key, hv.Value)
		}
		h.Set("Content-Type", "application/json")
		code := http.StatusOK
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			code = http.StatusTooManyRequests
		}
		w.WriteHeader(code)
		_, _ = w.Write(out)
	})
}

// errorName is the "error" of the JSON body of an answer with status code when no decision was made.
func errorName(code int) string {
	if code == policy.StatusClientClosedRequest {
		return "canceled"
	}
	return "rate_limiter_unavailable"
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = fmt.Fprintf(w, `{"error":%q}`+"\n", msg)
}

// writeReason writes a JSON error with the reason the request was refused: {"error": msg, "reason":
// reason}.
func writeReason(w http.ResponseWriter, code int, msg, reason string) {
	out, _ := json.Marshal(struct {
		Error  string `json:"error"`
		Reason string `json:"reason"`
	}{msg, reason})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(out, '\n'))
}
