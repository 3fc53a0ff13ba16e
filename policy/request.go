package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"net/http"
)

const (
	// anonymous is the value of a missing dimension under MissingShared; escaped values never
	// contain '*', so no real value collides with it.
	anonymous = "*"
	// longPrefix starts the hashed form of a value longer than MaxValueLen; escaped values never
	// contain '#'.
	longPrefix = "#sha256:"
	// maxSubject is the longest subject stored as is; longer ones are replaced by their SHA-256.
	maxSubject = 512
	// strictTag is the hash tag of every strict key when Policy.StrictTag is empty.
	strictTag = "policy"
)

// Request is what an [Enforcer] decides on. Package middleware builds one per HTTP request. The
// zero Request has no dimension values (a rule keyed by one sees it missing). Check reads it on the
// calling goroutine; it must not be changed while Check runs.
type Request struct {
	// Domain is the namespace of the request's counters (Envoy's rate-limit domain): requests of
	// different domains never share a counter. Empty means the policy's Domain. See Policy.Domain for
	// a domain the policy does not serve.
	Domain string
	// Method is the HTTP method (for per-method costs and Match.Methods), or empty.
	Method string
	// Cost, when at least 1, is the request's cost under every rule that sets no cost of its own
	// (Cost.Fixed, PerMethod, Func or FuncName): what Envoy's hits_addend is to the sidecar. 0 means
	// each rule's own cost (1 when it sets none).
	Cost int64
	// CheckOnly asks whether the request would be admitted without consuming anything (Envoy's
	// hits_addend of 0): hybrid rules answer with hybrid.Limiter.Peek's estimate for one unit;
	// strict rules, when all of them are UpstreamWindow rules, read their counts in Redis (refused
	// only when a count is already above its limit, with the remaining count as upstream reports
	// it); other strict rules answer only from the memo of their recent denials (their scripts
	// cannot look without counting); shadow rules are not consulted.
	CheckOnly bool
	// Rule names the one rule the request is checked against when the policy has Select set
	// (package sidecar sets it from envoyproxy/ratelimit's descriptor tree); ignored otherwise.
	Rule string
	// Tier is the request's tier name; empty or unknown means the policy's DefaultTier.
	Tier string
	// Dims gives the request's dimension values; nil means none (every dimension is missing).
	Dims Dimensions
	// HTTP is the HTTP request when there is one (for cost functions); nil otherwise.
	HTTP *http.Request
	// Decisions is optional storage for the Result's Decisions: when its capacity suffices, Check
	// appends to Decisions[:0] rather than allocating, and the Result shares its array.
	Decisions []Decision
}

// Dimensions gives a request's dimension values. An empty value counts as missing. Check calls it
// on its own goroutine, and not after it returns: an implementation needs no locking of its own
// unless it is shared.
type Dimensions interface {
	Dimension(name string) (value string, ok bool)
}

// Values is a map of dimension values; it implements [Dimensions]. A nil Values has no values. Like
// any map it is safe for concurrent reads, not for a write during a read.
type Values map[string]string

// Dimension returns v[name]. It does no I/O.
func (v Values) Dimension(name string) (string, bool) {
	s, ok := v[name]
	return s, ok
}

// subject returns the request's subject under r, in buf when it fits: "domain|" when the domain is
// not empty, then "dim=value,..." in the rule's canonical dimension order, values percent-escaped
// (or hashed when long, see appendValue), the whole hashed with WithHashKey's key when given. ok is
// false when a dimension is missing and the rule does not count missing keys in a shared bucket.
func (e *Enforcer) subject(r *crule, domain string, req *Request, buf *[192]byte) ([]byte, bool) {
	b := buf[:0]
	if domain != "" {
		// The domain first, ended by '|', which escaped values never contain.
		b = append(e.appendValue(b, domain), '|')
	}
	if len(r.dims) == 0 {
		b = append(b, anonymous...)
	}
	for i, dim := range r.dims {
		v, ok := "", false
		if req.Dims != nil {
			v, ok = req.Dims.Dimension(dim)
		}
		if dim == DimMethod && !ok {
			v, ok = req.Method, req.Method != ""
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, dim...)
		b = append(b, '=')
		if !ok || v == "" {
			if r.missing != MissingShared {
				return nil, false
			}
			b = append(b, anonymous...)
			continue
		}
		b = e.appendValue(b, v)
	}
	return e.finish(b, buf), true
}

// appendValue appends a dimension value to a subject: escaped (appendEscaped) when it is at most
// MaxValueLen bytes, else as longPrefix and the first 16 bytes of its SHA-256 in hex. Escaped values
// never contain '#', so a hashed value cannot collide with a short one, and every value, whatever
// its length or bytes, counts under its rule. The first long value an Enforcer sees is logged; all
// are counted in Stats.LongValues.
func (e *Enforcer) appendValue(b []byte, v string) []byte {
	if len(v) <= MaxValueLen {
		return appendEscaped(b, v)
	}
	e.stats.LongValues.Add(1)
	if e.longLogged.CompareAndSwap(false, true) {
		e.cfg.Logger.Warn("policy: a dimension value longer than MaxValueLen is counted under its SHA-256 "+
			"(logged once; see Stats.LongValues)", "bytes", len(v), "max", MaxValueLen)
	}
	sum := sha256.Sum256([]byte(v))
	return hex.AppendEncode(append(b, longPrefix...), sum[:16])
}

// tag returns the hash tag of the request's strict keys.
func (e *Enforcer) tag(c *compiled, req *Request) string {
	if c.tagDim == "" {
		return strictTag
	}
	v, ok := "", false
	if req.Dims != nil {
		v, ok = req.Dims.Dimension(c.tagDim)
	}
	if !ok || v == "" {
		return anonymous
	}
	var buf [192]byte
	return string(e.finish(e.appendValue(buf[:0], v), &buf))
}

// macState is a pooled HMAC with a buffer for its input, so that callers' buffers do not escape.
type macState struct {
	h   hash.Hash
	buf []byte
	sum [sha256.Size]byte
}

// finish hashes a subject when configured (or when it is too long to store), writing the result in
// out, and returns it; otherwise it returns b.
func (e *Enforcer) finish(b []byte, out *[192]byte) []byte {
	switch {
	case len(e.cfg.HashKey) > 0:
		st := e.macs.Get().(*macState)
		st.buf = append(st.buf[:0], b...)
		st.h.Reset()
		st.h.Write(st.buf)
		st.h.Sum(st.sum[:0])
		b = hex.AppendEncode(out[:0], st.sum[:16])
		e.macs.Put(st)
		return b
	case len(b) > maxSubject:
		sum := sha256.Sum256(b)
		return hex.AppendEncode(append(out[:0], "sha256-"...), sum[:16])
	}
	return b
}

// appendEscaped appends v with every byte outside [A-Za-z0-9._~/:@+-] and space percent-escaped,
// so values cannot contain the separators ',' and '=', the hash-tag braces, or '*'.
func appendEscaped(b []byte, v string) []byte {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '~' || c == '/' || c == ':' || c == '@' || c == '+' || c == '-' || c == ' ' {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
	}
	return b
}
