package central

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/hybridrate/hybridrate/internal/redisx"
)

// Version is the key-layout version embedded in every Redis key; it changes when the layout does.
// v2: leases (reconcile.lua), buckets per (key, limit), and disjoint namespaces for buckets and the
// limiter's own structures. v3: the same model in cheaper records (hexadecimal numbers in the
// bucket field, node records packed with struct.pack where Redis has it; reconcile.lua). The keys
// of package strict ("<prefix>:v1:{tag}:…", strict.Version) never share a name with them.
const Version = "v3"

// ErrBadPrefix is returned for a key prefix that is empty or contains a '{', '}' or whitespace.
var ErrBadPrefix = redisx.NewError(redisx.ClassInvalid, "central: key prefix must be non-empty and contain no braces or spaces")

// The namespaces under "<prefix>:v3:". User keys only ever appear after "b:" (buckets); the limiter's
// own structures live under "x:", which no user key can reach.
const (
	bucketSpace   = ":" + Version + ":b:"
	internalSpace = ":" + Version + ":x:"
)

// BucketKey returns the Redis key of the global bucket for key under lim:
// "<prefix>:v3:b:{<key>}:<rate>:<burst>". The key is the hash tag, so in a Cluster every bucket of one
// key lives in one slot. Any key is accepted, including one with braces or NUL bytes: two different
// (key, limit) pairs always give two different Redis keys, and none of them can equal [BansKey] or
// any other key of the limiter's own. The same key used with two limits has two buckets: each limit
// is enforced on its own (docs/accuracy.md, "One key, two limits").
func BucketKey(prefix, key string, lim Limit) string {
	return prefix + bucketSpace + "{" + key + "}:" + strconv.FormatFloat(lim.Rate, 'g', -1, 64) + ":" +
		strconv.FormatInt(lim.Burst, 10)
}

// BansKey returns the Redis key of the ban list, in the limiter's internal namespace.
func BansKey(prefix string) string { return prefix + internalSpace + "{bans}" }

// BansChannel returns the Pub/Sub channel that carries ban changes.
func BansChannel(prefix string) string { return prefix + internalSpace + "bans" }

// Bucket is the state of a global bucket as reconcile.lua stores it in the bucket's "b" field.
type Bucket struct {
	Tokens   int64   // tokens in the bucket, micro-tokens (negative: debt)
	Refilled int64   // time of the last refill, µs of Redis TIME
	Consumed int64   // tokens admitted in total, as the nodes reported them
	Demand   float64 // the key's demand, tokens/s, as the active nodes declared it
}

// BucketField is the hash field of a bucket's state; see [ParseBucket].
const BucketField = "b"

// ParseBucket decodes a bucket's "b" field ("t:s:c:w:nt:x": t and c decimal, the others
// hexadecimal, w in milli-tokens/s; reconcile.lua), for tests and admin tools.
func ParseBucket(b string) (Bucket, error) {
	p := strings.Split(b, ":")
	if len(p) != 6 {
		return Bucket{}, fmt.Errorf("%w: bucket field %q", ErrBadReply, b)
	}
	t, err1 := strconv.ParseInt(p[0], 10, 64)
	s, err2 := strconv.ParseInt(p[1], 16, 64)
	c, err3 := strconv.ParseInt(p[2], 10, 64)
	w, err4 := strconv.ParseInt(p[3], 16, 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Bucket{}, fmt.Errorf("%w: bucket field %q: %v", ErrBadReply, b, err)
	}
	return Bucket{Tokens: t, Refilled: s, Consumed: c, Demand: float64(w) / 1000}, nil
}
