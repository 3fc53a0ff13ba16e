package middleware

import (
	"context"
	"errors"
	"net/http"

	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/policy"
)

// Middleware rate-limits HTTP requests with a policy: for each request it extracts the dimensions
// (API key, user, client address, tenant, route, method, and your own), asks its policy.Checker, and
// either answers 429 itself or passes the request on with the decision in its context
// ([FromContext]). Create it with [New]; its [Middleware.Handler] method is a
// func(http.Handler) http.Handler for any net/http router. It is safe for concurrent use.
type Middleware struct {
	c policy.Checker
	o options
}

// New returns a middleware that asks c about every request. Options are applied in order; New
// returns the first option error.
func New(c policy.Checker, opts ...Option) (*Middleware, error) {
	if c == nil {
		return nil, errors.New("middleware: nil Checker")
	}
	o := defaultOptions()
	if err := option.Apply(&o, ErrBadOption, opts); err != nil {
		return nil, err
	}
	if err := o.checkCaps(); err != nil {
		return nil, err
	}
	return &Middleware{c: c, o: o}, nil
}

type ctxKey struct{}

// FromContext returns the policy's result for the request whose context ctx is: present in every
// request the middleware passed on. Its Decisions tell, per counter, the limit, what remains and who
// decided.
func FromContext(ctx context.Context) (policy.Result, bool) {
	st, ok := ctx.Value(ctxKey{}).(*state)
	if !ok {
		return policy.Result{}, false
	}
	return st.res, true
}

// state is everything the middleware keeps per request, in one allocation. It is also the context
// the next handler sees: the request's context plus the result, without a separate context.WithValue.
type state struct {
	context.Context // the request's context
	req             policy.Request
	dims            dims
	res             policy.Result
	decs            [3]policy.Decision // storage for res.Decisions
}

// stateHeaders is a state with room for the rate-limit header values, allocated instead of a bare
// state when headers are sent: one allocation either way, and none of its bytes when they are not.
// The header map's values point into hdr, so they keep the whole request state alive while they
// are referenced.
type stateHeaders struct {
	state
	hdr headerValues
}

// Value returns the state for ctxKey{} and defers to the request's context for other keys.
func (st *state) Value(key any) any {
	if _, ok := key.(ctxKey); ok {
		return st
	}
	return st.Context.Value(key)
}

// Handler wraps next: a denied request gets 429 (503 when the limiter could not decide and the rule
// fails closed: see [WithFailClosedStatus]) and never reaches next, as does one over a concurrency
// cap ([WithConcurrency]); an admitted one reaches next
// with the decision in its context and the rate-limit headers already set on w. A nil next answers
// admitted requests with 404, as an empty ServeMux would. The returned handler is safe for
// concurrent use; each request makes the Checker's I/O (none for a local decision) and, with
// WithConcurrency, one Redis call to acquire its lease and one to release it.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	if next == nil {
		next = http.NotFoundHandler()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sh := m.o.shed; sh != nil {
			p, ok := sh.enter(r)
			if !ok {
				writeShed(w, p, sh.retryAfter)
				return
			}
			if sh.counting {
				defer sh.inflight.Add(-1)
			}
		}
		if (m.o.exempt != nil || m.o.skipPreflight) && m.o.exempted(r) {
			next.ServeHTTP(w, r)
			return
		}
		var (
			st *state
			hv *headerValues
		)
		if m.o.headers != NoHeaders {
			sh := &stateHeaders{}
			st, hv = &sh.state, &sh.hdr
		} else {
			st = &state{}
		}
		st.dims = dims{m: m, r: r}
		st.req = policy.Request{Method: r.Method, Dims: &st.dims, HTTP: r, Decisions: st.decs[:0]}
		if m.o.tier != nil {
			st.req.Tier = m.o.tier(r)
		}
		res, err := m.c.Check(r.Context(), &st.req)
		if err != nil {
			m.o.onError(w, r, err)
			return
		}
		if !res.Allowed && res.MissingKey {
			writeMissing(w, m.o.missingStatus, res.Rule)
			return
		}
		if m.o.headers != NoHeaders {
			writeHeaders(w.Header(), m.o.headers, &res, hv)
		}
		if !res.Allowed {
			if res.Unavailable {
				writeUnavailable(w, &res, m.o.closedStatus, m.o.closedRetry)
				return
			}
			writeDenied(w, &res)
			return
		}
		st.res = res
		st.Context = r.Context()
		if len(m.o.caps) > 0 {
			m.serveCapped(w, r, next, st, 0)
			return
		}
		next.ServeHTTP(w, r.WithContext(st))
	})
}

// defaultErrorHandler answers with policy.ErrorStatus(err): 400 {"error":"bad_request"} for a
// request the policy refuses (an unknown domain, an invalid cost), 499 {"error":"canceled"} when the
// client gave up, 503 {"error":"rate_limiter_unavailable"} otherwise.
func defaultErrorHandler(w http.ResponseWriter, _ *http.Request, err error) {
	switch code := policy.ErrorStatus(err); code {
	case http.StatusBadRequest:
		writeJSON(w, code, []byte(`{"error":"bad_request"}`))
	case policy.StatusClientClosedRequest:
		writeJSON(w, code, []byte(`{"error":"canceled"}`))
	default:
		writeJSON(w, code, []byte(`{"error":"rate_limiter_unavailable"}`))
	}
}
