package policy

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"
)

// Checker decides on requests: the one request contract of the module. *Enforcer implements it,
// and so does *observe.Observer, which wraps another Checker; middleware.New, observe.New and
// sidecar.New take any Checker.
//
// Check returns the request's Result, or an error when no decision could be made (see
// [Enforcer.Check]); implementations must be safe for concurrent use. An implementation reads req
// (and calls its Dims) only during Check, on the calling goroutine, and keeps neither once Check
// returns: package middleware reuses both for later requests.
type Checker interface {
	Check(ctx context.Context, req *Request) (Result, error)
}

var _ Checker = (*Enforcer)(nil)

// Primary returns the counter that a request's rate-limit headers (X-RateLimit-Limit, -Remaining,
// -Reset) describe, the same over HTTP (package middleware) and the sidecar: when the request was
// denied, the denying decision with the longest RetryAfter (the first in a tie); otherwise the
// enforced decision with the fewest units left (the first in a tie). Shadow decisions and decisions
// without a limit are never primary. It returns nil when there is no such decision. It points into
// r.Decisions and does not allocate.
func (r *Result) Primary() *Decision {
	var best *Decision
	for i := range r.Decisions {
		d := &r.Decisions[i]
		if d.Shadow || d.Limit <= 0 {
			continue
		}
		switch {
		case best == nil:
			best = d
		case !d.Allowed && best.Allowed:
			best = d
		case !d.Allowed && !best.Allowed:
			if d.RetryAfter > best.RetryAfter {
				best = d
			}
		case d.Allowed && best.Allowed:
			if d.Remaining < best.Remaining {
				best = d
			}
		}
	}
	return best
}

// ResetSeconds is the decision's X-RateLimit-Reset: how long until its quota is full again, or until
// its denial ends if that is later, in whole seconds rounded up (0 for a quota already full). It
// does no I/O.
func (d *Decision) ResetSeconds() int64 { return CeilSeconds(max(d.ResetAfter, d.RetryAfter)) }

// CeilSeconds returns d in whole seconds, rounded up, and 0 for d <= 0: the unit of every rate-limit
// header (X-RateLimit-Reset, Retry-After, the draft RateLimit headers' t= and w=), over the middleware
// and the sidecar alike.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(d/time.Second) + min(int64(d%time.Second), 1)
}

// RetryAfterSeconds is the Retry-After of a refusal that may be retried after d: CeilSeconds(d), at
// least 1 (a refusal never says "retry now").
func RetryAfterSeconds(d time.Duration) int64 { return max(CeilSeconds(d), 1) }

// BuiltinDimensions returns the names of the dimensions every Enforcer knows without
// WithDimensions (DimAPIKey, DimUser, DimIP, DimTenant, DimRoute, DimMethod, DimDescriptor),
// sorted, in a new slice. DimGlobal, which names no value, is not among them.
func BuiltinDimensions() []string {
	dims := make([]string, 0, len(builtinDims))
	for d := range builtinDims {
		dims = append(dims, d)
	}
	slices.Sort(dims)
	return dims
}

// StatusClientClosedRequest is the HTTP status [ErrorStatus] gives a request whose caller gave up
// (context.Canceled): 499, as nginx and grpc-gateway use it; no standard status says so.
const StatusClientClosedRequest = 499

// ErrorStatus is the one mapping from an error of [Checker.Check] to the HTTP status a server
// answers with, used by package middleware and by the sidecar over HTTP and, through the same
// statuses, over gRPC (400 InvalidArgument, 499 Canceled, 503 Unavailable):
//   - nil: 200;
//   - an error matching [ErrBadRequest] (an unknown domain, an invalid cost): 400;
//   - context.Canceled (the caller gave up): [StatusClientClosedRequest];
//   - anything else (Redis could not serve, ErrNoPolicy, ErrClosed, a deadline): 503, no decision
//     could be made.
func ErrorStatus(err error) int {
	switch {
	case err == nil:
		return http.StatusOK
	case errors.Is(err, ErrBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, context.Canceled):
		return StatusClientClosedRequest
	}
	return http.StatusServiceUnavailable
}
