package middleware

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/hybridrate/hybridrate/policy"
)

// Canonical header keys, set directly in the header map.
const (
	hdrLimit       = "X-Ratelimit-Limit"
	hdrRemaining   = "X-Ratelimit-Remaining"
	hdrReset       = "X-Ratelimit-Reset"
	hdrPolicy      = "Ratelimit-Policy"
	hdrRateLimit   = "Ratelimit"
	hdrRetryAfter  = "Retry-After"
	hdrContentType = "Content-Type"
)

// draftPolicy is a RateLimit-Policy value the middleware formatted for a list of counters, with the
// X-RateLimit-Limit value of one of them: kept to be reused while requests meet the same counters
// (their quotas change only with the policy), so that these values cost neither formatting nor room
// in the request's state. It is never written once published.
type draftPolicy struct {
	keys       []policyKey // the enforced decisions' counters, in order
	value      string      // their RateLimit-Policy value
	limit      int64       // a primary decision's Limit
	limitValue string      // limit, formatted
}

// policyKey is what a counter's part of the RateLimit-Policy value depends on.
type policyKey struct {
	unit   string
	limit  int64
	window time.Duration
}

// matches reports whether ds's enforced decisions are the counters of c, in the same order.
func (c *draftPolicy) matches(ds []policy.Decision) bool {
	i := 0
	for k := range ds {
		d := &ds[k]
		if d.Shadow {
			continue
		}
		if i == len(c.keys) || c.keys[i] != (policyKey{unit: d.Unit, limit: d.Limit, window: d.Window}) {
			return false
		}
		i++
	}
	return i == len(c.keys)
}

// newDraftPolicy returns the cache entry for ds's RateLimit-Policy value and the primary p's limit.
func newDraftPolicy(ds []policy.Decision, value string, p *policy.Decision) *draftPolicy {
	c := &draftPolicy{value: strings.Clone(value), limit: p.Limit, limitValue: strconv.FormatInt(p.Limit, 10)}
	for i := range ds {
		if d := &ds[i]; !d.Shadow {
			c.keys = append(c.keys, policyKey{unit: d.Unit, limit: d.Limit, window: d.Window})
		}
	}
	return c
}

// policyRefresh is how many requests whose counters miss the cached RateLimit-Policy value (a
// policy whose requests meet different counters, by tier or route) format it before one replaces
// the cache, which allocates: at most one allocation per policyRefresh such requests.
const policyRefresh = 64

// writeHeaders sets the selected rate-limit headers of res on h. The values are in one string over
// buf (a request state's room for them, empty), except the RateLimit-Policy and X-RateLimit-Limit
// values when m.policy holds them, and the five one-value slices the map holds are in vals: no
// allocation unless the values outgrow buf (many counters with long names) or the cache is
// replaced (see policyRefresh). With both header sets, X-RateLimit-Remaining and X-RateLimit-Reset
// are the primary counter's numbers within the RateLimit value (the same numbers, formatted once).
func (m *Middleware) writeHeaders(h http.Header, set HeaderSet, res *policy.Result, vals *[5]string, buf []byte) {
	p := res.Primary()
	if p == nil {
		return
	}
	pc := m.policy.Load()
	b := buf
	// The values formatted into b, by index (limit, remaining, reset, policy, ratelimit): their
	// bounds in b; the ones taken from pc (bits of cached) are set in vals directly.
	var (
		start, end [5]int
		cached     uint8
	)
	if set&XRateLimitHeaders != 0 {
		if pc != nil && pc.limit == p.Limit {
			vals[0], cached = pc.limitValue, 1<<0
		} else {
			b = strconv.AppendInt(b, p.Limit, 10)
			end[0] = len(b)
		}
	}
	if set&DraftHeaders != 0 {
		if pc != nil && pc.matches(res.Decisions) {
			vals[3], cached = pc.value, cached|1<<3
		} else {
			start[3] = len(b)
			b = appendPolicy(b, res.Decisions)
			end[3] = len(b)
			if pc == nil || m.policyMisses.Add(1)%policyRefresh == 0 {
				m.policy.Store(newDraftPolicy(res.Decisions, string(b[start[3]:end[3]]), p))
			}
		}
		start[4] = len(b)
		n := 0
		for i := range res.Decisions {
			d := &res.Decisions[i]
			if d.Shadow {
				continue
			}
			b = appendMember(b, n, d.Unit, ";r=")
			n++
			r0 := len(b)
			b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
			r1 := len(b)
			b = append(b, ";t="...)
			t0 := len(b)
			b = strconv.AppendInt(b, d.ResetSeconds(), 10)
			if d == p { // never a shadow decision: X-RateLimit-Remaining and -Reset are these numbers
				start[1], end[1], start[2], end[2] = r0, r1, t0, len(b)
			}
		}
		end[4] = len(b)
	}
	if set&XRateLimitHeaders != 0 {
		if set&DraftHeaders == 0 {
			start[1] = len(b)
			b = strconv.AppendInt(b, max(p.Remaining, 0), 10)
			end[1] = len(b)
			start[2] = len(b)
			b = strconv.AppendInt(b, p.ResetSeconds(), 10)
			end[2] = len(b)
		}
	}
	// The strings alias b's bytes, buf's array or (if the values outgrew it) the one append
	// allocated; neither is written again, and the strings keep buf's array (the request's state)
	// alive.
	s := unsafe.String(unsafe.SliceData(b), len(b))
	for i := range vals {
		if cached&(1<<i) == 0 {
			vals[i] = s[start[i]:end[i]]
		}
	}
	if set&XRateLimitHeaders != 0 {
		h[hdrLimit], h[hdrRemaining], h[hdrReset] = vals[0:1:1], vals[1:2:2], vals[2:3:3]
	}
	if set&DraftHeaders != 0 {
		h[hdrPolicy], h[hdrRateLimit] = vals[3:4:4], vals[4:5:5]
	}
}

// appendPolicy appends the RateLimit-Policy value of ds's enforced decisions.
func appendPolicy(b []byte, ds []policy.Decision) []byte {
	n := 0
	for i := range ds {
		d := &ds[i]
		if d.Shadow {
			continue
		}
		b = appendMember(b, n, d.Unit, ";q=")
		n++
		b = strconv.AppendInt(b, d.Limit, 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, max(policy.CeilSeconds(d.Window), 1), 10)
	}
	return b
}

// appendMember starts the n-th (from 0) member of a RateLimit or RateLimit-Policy list: the
// separator before all but the first, unit as an sf-string, and param (";q=", ";r=").
func appendMember(b []byte, n int, unit, param string) []byte {
	if n > 0 {
		b = append(b, ", "...)
	}
	b = appendSFString(b, unit)
	return append(b, param...)
}

// writeDenied answers 429 with Retry-After and the stable JSON body
// {"error":"rate_limit_exceeded","rule":"<id>","retry_after_seconds":N}.
func writeDenied(w http.ResponseWriter, res *policy.Result) {
	secs := policy.RetryAfterSeconds(res.RetryAfter)
	w.Header()[hdrRetryAfter] = []string{strconv.FormatInt(secs, 10)}
	b := make([]byte, 0, 96)
	b = append(b, `{"error":"rate_limit_exceeded","rule":`...)
	b = appendJSONString(b, res.Rule)
	b = append(b, `,"retry_after_seconds":`...)
	b = strconv.AppendInt(b, secs, 10)
	b = append(b, "}\n"...)
	writeJSON(w, http.StatusTooManyRequests, b)
}

// writeUnavailable answers a fail-closed denial: the limiter could not decide.
func writeUnavailable(w http.ResponseWriter, res *policy.Result, status int, retry time.Duration) {
	if retry == 0 {
		retry = res.RetryAfter
	}
	secs := policy.RetryAfterSeconds(retry)
	w.Header()[hdrRetryAfter] = []string{strconv.FormatInt(secs, 10)}
	b := make([]byte, 0, 96)
	b = append(b, `{"error":"rate_limiter_unavailable","rule":`...)
	b = appendJSONString(b, res.Rule)
	b = append(b, `,"retry_after_seconds":`...)
	b = strconv.AppendInt(b, secs, 10)
	b = append(b, "}\n"...)
	writeJSON(w, status, b)
}

// writeMissing answers a request that lacks a key a rule needs.
func writeMissing(w http.ResponseWriter, status int, rule string) {
	b := append([]byte(`{"error":"missing_rate_limit_key","rule":`), appendJSONString(nil, rule)...)
	b = append(b, "}\n"...)
	writeJSON(w, status, b)
}

// writeShed answers a shed request: 503 with Retry-After.
func writeShed(w http.ResponseWriter, p Priority, retry time.Duration) {
	secs := policy.RetryAfterSeconds(retry)
	w.Header()[hdrRetryAfter] = []string{strconv.FormatInt(secs, 10)}
	b := append([]byte(`{"error":"load_shed","priority":`), appendJSONString(nil, p.String())...)
	b = append(b, `,"retry_after_seconds":`...)
	b = strconv.AppendInt(b, secs, 10)
	b = append(b, "}\n"...)
	writeJSON(w, http.StatusServiceUnavailable, b)
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h[hdrContentType] = []string{"application/json"}
	h["X-Content-Type-Options"] = []string{"nosniff"}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// appendJSONString appends s as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil { // cannot happen for a string
		return append(b, `""`...)
	}
	return append(b, q...)
}

// appendSFString appends s as a structured-field string (RFC 9651): in double quotes, with '"' and
// '\\' escaped. Rule names are plain ASCII; any other byte is replaced by '?', which the format
// cannot carry.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
