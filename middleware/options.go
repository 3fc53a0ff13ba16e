package middleware

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/policy"
)

// HeaderSet selects the rate-limit response headers to send. The zero HeaderSet is NoHeaders. It is
// a plain value, safe to copy and share.
type HeaderSet uint8

// The header sets; combine them with |.
const (
	// XRateLimitHeaders are X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset (seconds
	// until the quota is full again), for the rule closest to its limit.
	XRateLimitHeaders HeaderSet = 1 << iota
	// DraftHeaders are RateLimit-Policy and RateLimit of draft-ietf-httpapi-ratelimit-headers (the
	// structured-field form of drafts 08 to 11), listing every enforced counter consulted.
	DraftHeaders
	// NoHeaders sends no rate-limit header (Retry-After is still sent with 429 and 503 answers).
	NoHeaders HeaderSet = 0
	// AllHeaders sends both sets; the default.
	AllHeaders = XRateLimitHeaders | DraftHeaders
)

// Proxy headers a trusted proxy may set; see [WithTrustedProxies].
const (
	HeaderXForwardedFor = "X-Forwarded-For"
	HeaderForwarded     = "Forwarded"
	HeaderXRealIP       = "X-Real-Ip"
)

// DefaultAPIKeyHeader is the header the API key is read from unless [WithAPIKeyHeader] or
// [WithAPIKey] says otherwise.
const DefaultAPIKeyHeader = "X-API-Key"

// Option configures a [Middleware]; see the With functions. Options are immutable values, safe to
// share between goroutines and to pass to several New calls.
type Option interface{ option.Setter[options] }

type optionFunc = option.Func[options]

type options struct {
	apiKey        func(*http.Request) string
	user          func(*http.Request) string
	tenant        func(*http.Request) string
	route         func(*http.Request) string
	mux           *http.ServeMux
	custom        map[string]func(*http.Request) string
	tier          func(*http.Request) string
	trusted       []netip.Prefix
	proxyHeader   string
	ipv6Bits      int
	headers       HeaderSet
	missingStatus int
	onError       func(http.ResponseWriter, *http.Request, error)
	shed          *shedder
	closedStatus  int           // status of a fail-closed denial
	closedRetry   time.Duration // its Retry-After; 0: the decision's
	exempt        []string      // methods not rate-limited
	skipPreflight bool          // CORS preflight requests are not rate-limited
	caps          []Concurrency // in-flight caps, taken in order
	noContext     bool          // admitted requests are passed on unchanged (WithoutContextResult)
}

func defaultOptions() options {
	return options{
		apiKey:        HeaderValue(DefaultAPIKeyHeader),
		proxyHeader:   HeaderXForwardedFor,
		ipv6Bits:      64,
		headers:       AllHeaders,
		missingStatus: http.StatusUnauthorized,
		onError:       defaultErrorHandler,
		closedStatus:  http.StatusServiceUnavailable,
	}
}

// ErrBadOption is wrapped by every option error from [New].
var ErrBadOption = errors.New("middleware: bad option")

func badOption(format string, args ...any) error { return option.Bad(ErrBadOption, format, args...) }

// HeaderValue returns a function that reads the named request header, for the With functions that
// take one. For "Authorization", the scheme ("Bearer ", "Basic ", ...) is cut off.
func HeaderValue(name string) func(*http.Request) string {
	name = http.CanonicalHeaderKey(name)
	if name == "Authorization" {
		return func(r *http.Request) string {
			v := r.Header.Get(name)
			if _, cred, ok := strings.Cut(v, " "); ok {
				return strings.TrimSpace(cred)
			}
			return v
		}
	}
	return func(r *http.Request) string {
		if vs := r.Header[name]; len(vs) > 0 {
			return vs[0]
		}
		return ""
	}
}

// WithAPIKeyHeader reads the "api_key" dimension from the named header. The default is
// DefaultAPIKeyHeader ("X-API-Key"); "Authorization" takes the credentials after the scheme.
func WithAPIKeyHeader(name string) Option {
	return optionFunc(func(o *options) error {
		if name == "" || strings.ContainsAny(name, " \t\r\n:") {
			return badOption("API key header %q: want a header name", name)
		}
		o.apiKey = HeaderValue(name)
		return nil
	})
}

// WithAPIKey sets the function that returns a request's API key (the "api_key" dimension); an
// empty answer means the request has none.
func WithAPIKey(f func(*http.Request) string) Option { return dimFunc("API key", &optsAPIKey, f) }

// WithUser sets the function that returns the authenticated user (the "user" dimension), typically
// from a value your authentication middleware put in the request's context; empty means anonymous.
func WithUser(f func(*http.Request) string) Option { return dimFunc("user", &optsUser, f) }

// WithTenant sets the function that returns the request's tenant (the "tenant" dimension).
func WithTenant(f func(*http.Request) string) Option { return dimFunc("tenant", &optsTenant, f) }

// WithRoute sets the function that returns the request's route (the "route" dimension, and what
// Match.Routes compares). Without it the route is the pattern of the mux given to [WithMux], or else
// r.Pattern, the pattern a Go 1.22+ ServeMux routed the request by (set when the middleware wraps a
// handler registered on the mux). Never use the raw URL path: every distinct path would become a
// counter.
func WithRoute(f func(*http.Request) string) Option { return dimFunc("route", &optsRoute, f) }

// selectors of the option fields set by dimFunc.
var (
	optsAPIKey = func(o *options) *func(*http.Request) string { return &o.apiKey }
	optsUser   = func(o *options) *func(*http.Request) string { return &o.user }
	optsTenant = func(o *options) *func(*http.Request) string { return &o.tenant }
	optsRoute  = func(o *options) *func(*http.Request) string { return &o.route }
)

func dimFunc(what string, field *func(*options) *func(*http.Request) string, f func(*http.Request) string) Option {
	sel := *field
	return optionFunc(func(o *options) error {
		if f == nil {
			return badOption("nil %s function", what)
		}
		*sel(o) = f
		return nil
	})
}

// WithMux names the ServeMux the middleware sits in front of, so that the "route" dimension is the
// pattern that mux will route the request by (found with mux.Handler), for a middleware that wraps
// the whole mux, where r.Pattern is not yet set (or is an outer mux's pattern).
func WithMux(mux *http.ServeMux) Option {
	return optionFunc(func(o *options) error {
		if mux == nil {
			return badOption("nil ServeMux")
		}
		o.mux = mux
		return nil
	})
}

// WithDimension adds a dimension of the given name (declare it in policy.WithDimensions too),
// computed by f; an empty answer means missing.
func WithDimension(name string, f func(*http.Request) string) Option {
	return optionFunc(func(o *options) error {
		switch name {
		case policy.DimAPIKey, policy.DimUser, policy.DimIP, policy.DimTenant, policy.DimRoute, policy.DimMethod, policy.DimGlobal:
			return badOption("dimension %q is built in", name)
		}
		if name == "" || f == nil {
			return badOption("dimension %q: want a name and a function", name)
		}
		if o.custom == nil {
			o.custom = map[string]func(*http.Request) string{}
		}
		o.custom[name] = f
		return nil
	})
}

// WithTier sets the function that returns the request's tier name (for the policy's tiered rules);
// empty or unknown means the policy's default tier.
func WithTier(f func(*http.Request) string) Option {
	return optionFunc(func(o *options) error {
		if f == nil {
			return badOption("nil tier function")
		}
		o.tier = f
		return nil
	})
}

// WithTrustedProxies says which direct peers are your own proxies and which header they set:
// HeaderXForwardedFor (the default), HeaderForwarded (RFC 7239) or HeaderXRealIP. The header is
// honoured only when the request's direct peer is in proxies; X-Forwarded-For and Forwarded are then
// walked from the right, skipping addresses in proxies, and the first other address is the client.
// A request from any other peer is keyed by that peer's address, whatever headers it sends: without
// this option no header is trusted. Name only the header your proxies overwrite or append to; a
// header they pass through untouched is the client's to forge.
func WithTrustedProxies(header string, proxies ...netip.Prefix) Option {
	return optionFunc(func(o *options) error {
		switch http.CanonicalHeaderKey(header) {
		case HeaderXForwardedFor, HeaderForwarded, HeaderXRealIP:
			o.proxyHeader = http.CanonicalHeaderKey(header)
		default:
			return badOption("proxy header %q: want X-Forwarded-For, Forwarded or X-Real-IP", header)
		}
		for _, p := range proxies {
			if !p.IsValid() {
				return badOption("invalid trusted proxy prefix %v", p)
			}
			o.trusted = append(o.trusted, p.Masked())
		}
		return nil
	})
}

// WithIPv6Prefix sets how many leading bits of an IPv6 client address form its "ip" dimension, from
// 32 to 128. The default is 64: a host usually owns a whole /64, and keying by full address would let
// it take 2^64 buckets.
func WithIPv6Prefix(bits int) Option {
	return optionFunc(func(o *options) error {
		if bits < 32 || bits > 128 {
			return badOption("IPv6 prefix /%d: want 32 to 128", bits)
		}
		o.ipv6Bits = bits
		return nil
	})
}

// WithHeaders selects the rate-limit headers to send; the default is AllHeaders.
func WithHeaders(set HeaderSet) Option {
	return optionFunc(func(o *options) error {
		if set&^AllHeaders != 0 {
			return badOption("unknown header set %d", set)
		}
		o.headers = set
		return nil
	})
}

// WithMissingKeyStatus sets the status of the answer to a request that lacks a key a rule needs
// (under missing_key: reject), from 400 to 599. The default is 401 Unauthorized. The body is
// {"error":"missing_rate_limit_key","rule":"<rule id>"}.
func WithMissingKeyStatus(code int) Option {
	return optionFunc(func(o *options) error {
		if code < 400 || code > 599 {
			return badOption("missing-key status %d: want 400 to 599", code)
		}
		o.missingStatus = code
		return nil
	})
}

// WithErrorHandler sets what answers a request when no decision could be made (the policy's
// Enforcer returned an error: Redis error replies, a closed Enforcer, an invalid cost). The default
// answers with policy.ErrorStatus, the statuses of the sidecar too: 400 {"error":"bad_request"} for
// an unknown domain or an invalid cost, 499 {"error":"canceled"} when the client gave up, and 503
// {"error":"rate_limiter_unavailable"} otherwise. A handler that wants to fail open may call the
// next handler itself.
func WithErrorHandler(f func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return optionFunc(func(o *options) error {
		if f == nil {
			return badOption("nil error handler")
		}
		o.onError = f
		return nil
	})
}

// WithFailClosedStatus sets the status of the answer to a request denied only because Redis could
// not answer and the denying rule fails closed (on_failure: fail_closed; policy.Result.Unavailable):
// 429, or 500 to 599. The default is 503 Service Unavailable, so that clients and dashboards can tell
// "limiter unavailable" from "over your limit". The body is
// {"error":"rate_limiter_unavailable","rule":"<rule id>","retry_after_seconds":N}, with Retry-After.
func WithFailClosedStatus(code int) Option {
	return optionFunc(func(o *options) error {
		if code != http.StatusTooManyRequests && (code < 500 || code > 599) {
			return badOption("fail-closed status %d: want 429 or 500 to 599", code)
		}
		o.closedStatus = code
		return nil
	})
}

// WithFailClosedRetryAfter sets the Retry-After of a fail-closed denial (see [WithFailClosedStatus]),
// from 0 to 1 hour, sent in whole seconds rounded up. The default, 0, sends the failure policy's own
// retry-after (the circuit breaker's cooldown: 1 second once rounded).
func WithFailClosedRetryAfter(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d < 0 || d > time.Hour {
			return badOption("fail-closed retry-after %v: want 0 to 1h", d)
		}
		o.closedRetry = d
		return nil
	})
}

// WithExemptMethods lets requests with these methods (say, "HEAD" and "OPTIONS") through without
// consulting the policy: they are neither counted nor limited, and carry no result in their context
// ([FromContext] reports false). By default every method is charged, HEAD and OPTIONS (CORS
// preflight) included. To exempt methods from some rules only, use the rules' match.methods.
func WithExemptMethods(methods ...string) Option {
	return optionFunc(func(o *options) error {
		for _, m := range methods {
			if m == "" || strings.ContainsAny(m, " \t\r\n") {
				return badOption("exempt method %q", m)
			}
			o.exempt = append(o.exempt, strings.ToUpper(m))
		}
		return nil
	})
}

// WithSkipPreflight lets CORS preflight requests through without consulting the policy: OPTIONS
// requests that carry both Origin and Access-Control-Request-Method. Other OPTIONS requests are still
// charged (unless exempted with [WithExemptMethods]). By default preflights are charged, so a browser
// client pays twice for each cross-origin request that needs one.
func WithSkipPreflight() Option {
	return optionFunc(func(o *options) error {
		o.skipPreflight = true
		return nil
	})
}

// WithoutContextResult passes admitted requests on unchanged, without the policy's result in their
// context: [FromContext] reports false in the next handler. It is for handlers that never call
// FromContext; the headers and the answers to denied requests are the same. It saves what passing
// the result costs: net/http's copy of the request (Request.WithContext, 304 bytes) and the
// result's storage. A request then allocates only its header values' storage (one allocation of
// 144 bytes with one counter, 320 with more), and nothing under WithHeaders(NoHeaders); by default
// it allocates one of 640 bytes (512 without headers). By default the result is in the context.
func WithoutContextResult() Option {
	return optionFunc(func(o *options) error {
		o.noContext = true
		return nil
	})
}

// exempted reports whether r skips the policy.
func (o *options) exempted(r *http.Request) bool {
	for _, m := range o.exempt {
		if r.Method == m {
			return true
		}
	}
	return o.skipPreflight && r.Method == http.MethodOptions &&
		r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != ""
}

// WithLoadShedding sheds requests by priority as the server's utilisation rises; see [Shedding].
func WithLoadShedding(s Shedding) Option {
	return optionFunc(func(o *options) error {
		sh, err := newShedder(s)
		if err != nil {
			return err
		}
		o.shed = sh
		return nil
	})
}
