package middleware

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"time"

	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/policy"
)

// Concurrency caps the requests in flight per key across every node that shares the Limiter's
// Redis: "at most 20 requests of each tenant at once". See [WithConcurrency]. The zero Concurrency
// is invalid (Limiter, Dimension, Limit and TTL are required); WithConcurrency copies it. It is a
// plain value, safe to copy.
type Concurrency struct {
	// Limiter holds the leases, one per request in flight; required.
	Limiter *concurrency.Limiter
	// Dimension names what the cap is per: a built-in dimension (policy.DimTenant, DimAPIKey,
	// DimUser, DimIP, DimRoute, DimMethod), one added with [WithDimension], or policy.DimGlobal for
	// one cap over every request. Its value comes from the same functions the policy's keys do; a
	// request without it is not capped. Required.
	Dimension string
	// Limit is the most requests in flight per key, from 1 to concurrency.MaxLimit.
	Limit int
	// TTL is the life of a request's lease, from 1ms to concurrency.MaxTTL: if a node dies while
	// serving, its requests' slots come back after TTL. Make it longer than your slowest request
	// (the server's WriteTimeout, say): a request that outlives its TTL loses its slot, and the key
	// may then exceed Limit until the request ends. Required.
	TTL time.Duration
}

// WithConcurrency caps the requests in flight per key: a request the policy admitted takes a lease
// from c.Limiter (one Redis round trip) before it reaches the next handler, and gives it back when
// the handler returns or panics (another round trip). A request whose key is full gets 429 Too Many
// Requests, Retry-After: 1 and {"error":"concurrency_limit_exceeded","dimension":"<dimension>",
// "retry_after_seconds":1}; one denied because Redis could not answer and c.Limiter fails closed
// gets the fail-closed answer of [WithFailClosedStatus] (503 by default) with
// {"error":"rate_limiter_unavailable","dimension":"<dimension>","retry_after_seconds":N}. The
// option can be given several times (per tenant and per user, say); the caps are taken in order.
// The dimension's value reaches Redis as it is, prefixed by the dimension's name (values longer
// than concurrency.MaxKeyLen are hashed): the policy's HashKey does not apply.
func WithConcurrency(c Concurrency) Option {
	return optionFunc(func(o *options) error {
		switch {
		case c.Limiter == nil:
			return badOption("concurrency: nil Limiter")
		case c.Dimension == "":
			return badOption("concurrency: no dimension")
		case c.Limit < 1 || c.Limit > concurrency.MaxLimit:
			return badOption("concurrency: limit %d, want 1 to %d", c.Limit, concurrency.MaxLimit)
		case c.TTL < time.Millisecond || c.TTL > concurrency.MaxTTL:
			return badOption("concurrency: TTL %v, want 1ms to %v", c.TTL, concurrency.MaxTTL)
		}
		o.caps = append(o.caps, c)
		return nil
	})
}

// checkCaps reports an error for a cap on a dimension the middleware cannot compute; New calls it
// once every option is applied (WithDimension may come after WithConcurrency).
func (o *options) checkCaps() error {
	for _, c := range o.caps {
		switch c.Dimension {
		case policy.DimGlobal, policy.DimAPIKey, policy.DimUser, policy.DimIP, policy.DimTenant, policy.DimRoute, policy.DimMethod:
			continue
		}
		if _, ok := o.custom[c.Dimension]; !ok {
			return badOption("concurrency: unknown dimension %q", c.Dimension)
		}
	}
	return nil
}

// capKey returns the concurrency key of a request for c ("<dimension>=<value>"), or false when the
// request has no value for c's dimension.
func capKey(c *Concurrency, d *dims) (string, bool) {
	if c.Dimension == policy.DimGlobal {
		return policy.DimGlobal, true
	}
	v, ok := d.Dimension(c.Dimension)
	if !ok {
		return "", false
	}
	key := c.Dimension + "=" + v
	if len(key) > concurrency.MaxKeyLen {
		sum := sha256.Sum256([]byte(v))
		key = c.Dimension + "#" + hex.EncodeToString(sum[:])
	}
	return key, true
}

// serveCapped takes the leases of caps[i:] in turn and then serves the request; each lease is
// released when the handler returns, or panics.
func (m *Middleware) serveCapped(w http.ResponseWriter, r *http.Request, next http.Handler, st *state, d *dims, i int) {
	if i == len(m.o.caps) {
		if st != nil { // nil under WithoutContextResult
			r = st.request(r)
		}
		next.ServeHTTP(w, r)
		return
	}
	c := &m.o.caps[i]
	key, ok := capKey(c, d)
	if !ok {
		m.serveCapped(w, r, next, st, d, i+1)
		return
	}
	lease, err := c.Limiter.TryAcquire(r.Context(), key, c.Limit, c.TTL)
	if err != nil { // a closed Limiter, or the request's context ended
		m.o.onError(w, r, err)
		return
	}
	if !lease.Acquired() {
		if lease.Unavailable() {
			retry := m.o.closedRetry
			if retry == 0 {
				retry = lease.RetryAfter()
			}
			writeCapped(w, m.o.closedStatus, "rate_limiter_unavailable", c.Dimension, retry)
			return
		}
		writeCapped(w, http.StatusTooManyRequests, "concurrency_limit_exceeded", c.Dimension, time.Second)
		return
	}
	defer lease.Release(r.Context()) // a release that fails frees the slot at its TTL
	m.serveCapped(w, r, next, st, d, i+1)
}

// writeCapped answers a request turned away by a concurrency cap.
func writeCapped(w http.ResponseWriter, status int, code, dimension string, retry time.Duration) {
	secs := policy.RetryAfterSeconds(retry)
	w.Header()[hdrRetryAfter] = []string{strconv.FormatInt(secs, 10)}
	b := make([]byte, 0, 96)
	b = append(b, `{"error":"`...)
	b = append(b, code...)
	b = append(b, `","dimension":`...)
	b = appendJSONString(b, dimension)
	b = append(b, `,"retry_after_seconds":`...)
	b = strconv.AppendInt(b, secs, 10)
	b = append(b, "}\n"...)
	writeJSON(w, status, b)
}
