package middleware

import (
	"encoding/json"
	"net/http"
	"strconv"
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

// headerValues is the storage of one response's rate-limit header values, part of the request's
// state (one allocation per request for everything): the five values' bytes and the five one-value
// slices the header map holds.
type headerValues struct {
	vals [5]string
	buf  [256]byte // the values' bytes; never written again once the strings point into it
}

// writeHeaders sets the selected rate-limit headers of res on h, building every value in one string
// held in hv: no allocation unless the values outgrow hv.buf (many counters with long names).
func writeHeaders(h http.Header, set HeaderSet, res *policy.Result, hv *headerValues) {
	p := res.Primary()
	if p == nil {
		return
	}
	b := hv.buf[:0]
	var ends [5]int // ends of the values in b: limit, remaining, reset, policy, ratelimit
	if set&XRateLimitHeaders != 0 {
		b = strconv.AppendInt(b, p.Limit, 10)
		ends[0] = len(b)
		b = strconv.AppendInt(b, max(p.Remaining, 0), 10)
		ends[1] = len(b)
		b = strconv.AppendInt(b, p.ResetSeconds(), 10)
		ends[2] = len(b)
	}
	if set&DraftHeaders != 0 {
		first := true
		for i := range res.Decisions {
			d := &res.Decisions[i]
			if d.Shadow {
				continue
			}
			if !first {
				b = append(b, ", "...)
			}
			first = false
			b = appendSFString(b, d.Unit)
			b = append(b, ";q="...)
			b = strconv.AppendInt(b, d.Limit, 10)
			b = append(b, ";w="...)
			b = strconv.AppendInt(b, max(policy.CeilSeconds(d.Window), 1), 10)
		}
		ends[3] = len(b)
		first = true
		for i := range res.Decisions {
			d := &res.Decisions[i]
			if d.Shadow {
				continue
			}
			if !first {
				b = append(b, ", "...)
			}
			first = false
			b = appendSFString(b, d.Unit)
			b = append(b, ";r="...)
			b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
			b = append(b, ";t="...)
			b = strconv.AppendInt(b, d.ResetSeconds(), 10)
		}
		ends[4] = len(b)
	}
	// The string aliases b's bytes, hv.buf or (if the values outgrew it) the array append allocated;
	// neither is written again, and the strings keep hv (the request's state) alive.
	s := unsafe.String(unsafe.SliceData(b), len(b))
	vals := hv.vals[:]
	start := 0
	if set&XRateLimitHeaders != 0 {
		vals[0], vals[1], vals[2] = s[:ends[0]], s[ends[0]:ends[1]], s[ends[1]:ends[2]]
		h[hdrLimit], h[hdrRemaining], h[hdrReset] = vals[0:1:1], vals[1:2:2], vals[2:3:3]
		start = ends[2]
	}
	if set&DraftHeaders != 0 {
		vals[3], vals[4] = s[start:ends[3]], s[ends[3]:ends[4]]
		h[hdrPolicy], h[hdrRateLimit] = vals[3:4:4], vals[4:5:5]
	}
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
