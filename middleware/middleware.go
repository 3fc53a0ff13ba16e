package middleware

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"

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
	// denying is set while the last request checked was denied: the next request's state is then
	// allocated only if it is admitted, after its check (newState), rather than before it
	// (newStateAhead), so that a run of denials allocates no state. It is written only when it
	// changes.
	denying atomic.Bool
	// wide is set once a request had more decisions than a narrow state holds: every later state
	// allocated before its check is a wide one (see newStateAhead). It is never cleared.
	wide atomic.Bool
	// policy caches the RateLimit-Policy and X-RateLimit-Limit values (see writeHeaders).
	policy       atomic.Pointer[draftPolicy]
	policyMisses atomic.Uint64 // requests whose counters missed policy
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
// request the middleware passed on, unless it was built with [WithoutContextResult]. Its Decisions
// tell, per counter, the limit, what remains and who decided.
func FromContext(ctx context.Context) (policy.Result, bool) {
	st, ok := ctx.Value(ctxKey{}).(*state)
	if !ok {
		return policy.Result{}, false
	}
	return st.res, true
}

// state is what the middleware keeps per request once the policy has answered, in one allocation
// with the storage of the result's decisions and of the header values (newState). It is also the
// context the next handler sees: the request's context plus the result, without a separate
// context.WithValue; and it holds the request the next handler gets (see request), which would
// otherwise be an allocation of its own. What only the check needs (the policy.Request and the
// dimension values) is in a pooled scratch instead (see scratch): a state is referenced by the next
// handler's request and context and by the header map for as long as they live, so it cannot be
// reused.
type state struct {
	context.Context // the request's context
	res             policy.Result
	req             http.Request // the request passed on (see request); zero until then
}

// request returns r with st as its context, as r.WithContext(st) does, but in st's own storage:
// a shallow copy of r (WithContext, inlined here, makes its copy on the stack, which is then copied
// into st), so that passing the request on allocates nothing beyond the state. It is called once,
// when the request is passed on, after st.Context and st.res are set.
func (st *state) request(r *http.Request) *http.Request {
	st.req = *r.WithContext(st)
	return &st.req
}

// scratch is what a request needs while the policy checks it (and while the concurrency caps take
// their leases): the policy.Request, its dimension values and the storage the policy writes its
// decisions into (copied into the request's state when the request is admitted with its result in
// the context: see newState). The Checker reads the first two only during Check (see
// policy.Request and policy.Dimensions), and nothing reads the decisions' storage once the state
// holds its copy or the headers are written, so all three are reused across requests through
// scratchPool rather than allocated with every request.
type scratch struct {
	req  policy.Request
	dims dims
	decs [3]policy.Decision // the storage of the policy's decisions (req.Decisions)
}

var scratchPool = sync.Pool{New: func() any {
	sc := new(scratch)
	sc.req.Dims = &sc.dims
	return sc
}}

// getScratch returns a scratch for r, its request's decisions to be stored in decs (in the scratch
// when decs is nil). The dimension values a previous request left are not cleared: done marks none
// of them computed.
func (m *Middleware) getScratch(r *http.Request, decs []policy.Decision) *scratch {
	sc := scratchPool.Get().(*scratch)
	if decs == nil {
		decs = sc.decs[:0]
	}
	sc.dims.m, sc.dims.r, sc.dims.done = m, r, 0
	q := &sc.req
	if q.Domain != "" || q.Rule != "" || q.Cost != 0 || q.CheckOnly || q.Dims != policy.Dimensions(&sc.dims) {
		*q = policy.Request{Dims: &sc.dims} // the middleware never sets these; a Checker changed them
	}
	q.Method, q.Tier, q.HTTP, q.Decisions = r.Method, "", r, decs
	return sc
}

// putScratch returns sc to the pool, dropping its references to the request and to its state so
// that a pooled scratch keeps neither alive (the dimension values and the decisions' rule names,
// small strings, stay until the scratch's next use or the pool's clearing).
func putScratch(sc *scratch) {
	sc.dims.r, sc.req.HTTP, sc.req.Decisions = nil, nil, nil
	scratchPool.Put(sc)
}

// The request states newState allocates: room for one decision or three (more than three are in
// the policy's own allocation, which the state keeps), with or without room for the header values.
// Each is one allocation, which also holds the request passed on (state.req); the header map's
// values point into its buffer, so they keep the whole request state alive while they are
// referenced. Their sizes (TestStateSizes) keep a one-rule state with header room in the 640-byte
// size class (632 bytes and the 8-byte type header Go's allocator adds above 512) and in the
// 512-byte class without: 640 and 496 bytes an admitted request, where the state and net/http's
// copy of the request in Request.WithContext were 352 + 320 and 192 + 320 bytes in two
// allocations. A state is allocated before the check unless the last request was denied (see
// Middleware.denying): a run of denied requests, and admitted ones under WithoutContextResult,
// allocate only the header values' storage (headerRoom).
type (
	stateNarrow struct {
		state
		decs [1]policy.Decision
	}
	stateNarrowHeaders struct {
		state
		decs [1]policy.Decision
		vals [5]string
		buf  [narrowHeaderBytes]byte
	}
	stateWide struct {
		state
		decs [3]policy.Decision
	}
	stateWideHeaders struct {
		state
		decs [3]policy.Decision
		vals [5]string
		buf  [wideHeaderBytes]byte
	}
)

// headerRoom and headerRoomWide are the storage of the header values of a request that has no state
// (denied after a denial, or admitted under WithoutContextResult): one allocation, 144 or 320 bytes
// (TestStateSizes), kept alive by the header map.
type (
	headerRoom struct {
		vals [5]string
		buf  [narrowHeaderBytes]byte
	}
	headerRoomWide struct {
		vals [5]string
		buf  [wideHeaderBytes]byte
	}
)

// The room for header values in a state: one decision's five values take about 70 bytes with
// 10-digit limits and a 7-byte rule name, about 30 once the RateLimit-Policy and X-RateLimit-Limit
// values are cached (writeHeaders; X-RateLimit-Remaining and -Reset are then parts of the RateLimit
// value), leaving room for longer names; values that outgrow it are still written, in an array of
// their own (TestNarrowHeaderRoom: the cached case with 10-digit counts and a 34-byte rule name
// fits). 56 bytes make a one-rule state with header room 632 bytes, and 216 a three-rule one 1,016
// bytes, each with Go's 8-byte type header the whole of a size class (640, 1,024;
// TestStateSizes).
const (
	narrowHeaderBytes = 56
	wideHeaderBytes   = 216
)

// newState returns the state of an admitted request whose result is res, allocated after its
// check (the last request was denied: see Middleware.denying): res with its decisions copied into
// the state (up to three; more are in the policy's own allocation, which the state keeps), and,
// when headers are sent, the storage of their values. It is sized by res: one decision or three.
func newState(res *policy.Result, headers bool) (st *state, vals *[5]string, buf []byte) {
	n := len(res.Decisions)
	var decs []policy.Decision // the state's storage for res.Decisions
	switch {
	case n <= 1 && headers:
		s := &stateNarrowHeaders{}
		st, decs, vals, buf = &s.state, s.decs[:], &s.vals, s.buf[:0]
	case n <= 1:
		s := &stateNarrow{}
		st, decs = &s.state, s.decs[:]
	case headers:
		s := &stateWideHeaders{}
		st, decs, vals, buf = &s.state, s.decs[:], &s.vals, s.buf[:0]
	default:
		s := &stateWide{}
		st, decs = &s.state, s.decs[:]
	}
	st.res = *res
	if n > 0 && n <= len(decs) {
		st.res.Decisions = decs[:copy(decs, res.Decisions)]
	}
	return st, vals, buf
}

// newStateAhead returns a zeroed request state allocated before the check, so that the policy
// writes its decisions straight into the state (decs: empty, with room for one decision or three)
// rather than into the scratch to be copied (newState; the copy cost 6.8% of a request's CPU time,
// p = 0.012, in BenchmarkMiddleware's one-rule row), and, when headers are sent, the storage of
// their values. It starts narrow and is wide for good after the first request with more than one
// decision.
func (m *Middleware) newStateAhead(headers bool) (st *state, decs []policy.Decision, vals *[5]string, buf []byte) {
	switch wide := m.wide.Load(); {
	case !wide && headers:
		s := &stateNarrowHeaders{}
		return &s.state, s.decs[:0], &s.vals, s.buf[:0]
	case !wide:
		s := &stateNarrow{}
		return &s.state, s.decs[:0], nil, nil
	case headers:
		s := &stateWideHeaders{}
		return &s.state, s.decs[:0], &s.vals, s.buf[:0]
	default:
		s := &stateWide{}
		return &s.state, s.decs[:0], nil, nil
	}
}

// newHeaderRoom returns the storage of the header values of a request with n decisions and no
// state.
func newHeaderRoom(n int) (vals *[5]string, buf []byte) {
	if n <= 1 {
		h := &headerRoom{}
		return &h.vals, h.buf[:0]
	}
	h := &headerRoomWide{}
	return &h.vals, h.buf[:0]
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
		headers := m.o.headers != NoHeaders
		var (
			st   *state // nil for a denied request allocated none, and under WithoutContextResult
			decs []policy.Decision
			vals *[5]string
			buf  []byte
		)
		if !m.o.noContext && !m.denying.Load() {
			st, decs, vals, buf = m.newStateAhead(headers)
		}
		sc := m.getScratch(r, decs)
		if m.o.tier != nil {
			sc.req.Tier = m.o.tier(r)
		}
		res, err := m.c.Check(r.Context(), &sc.req)
		if err != nil {
			putScratch(sc)
			m.o.onError(w, r, err)
			return
		}
		if len(res.Decisions) > 1 && !m.wide.Load() { // more than a narrow state holds
			m.wide.Store(true)
		}
		if m.denying.Load() == res.Allowed {
			m.denying.Store(!res.Allowed)
		}
		if !res.Allowed && res.MissingKey {
			putScratch(sc)
			writeMissing(w, m.o.missingStatus, res.Rule)
			return
		}
		switch {
		case st != nil: // allocated before the check; unused by a denied request
			if headers {
				m.writeHeaders(w.Header(), m.o.headers, &res, vals, buf)
			}
			st.res = res
			st.Context = r.Context()
		case res.Allowed && !m.o.noContext:
			st, vals, buf = newState(&res, headers)
			if headers {
				m.writeHeaders(w.Header(), m.o.headers, &st.res, vals, buf)
			}
			st.Context = r.Context()
		case headers:
			vals, buf = newHeaderRoom(len(res.Decisions))
			m.writeHeaders(w.Header(), m.o.headers, &res, vals, buf)
		}
		if !res.Allowed {
			putScratch(sc)
			if res.Unavailable {
				writeUnavailable(w, &res, m.o.closedStatus, m.o.closedRetry)
				return
			}
			writeDenied(w, &res)
			return
		}
		if len(m.o.caps) > 0 {
			// The caps read the request's dimensions; the scratch is not returned if a handler panics.
			m.serveCapped(w, r, next, st, &sc.dims, 0)
			putScratch(sc)
			return
		}
		putScratch(sc)
		if st != nil {
			r = st.request(r)
		}
		next.ServeHTTP(w, r)
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
