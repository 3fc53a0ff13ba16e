package central

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Version is the key-layout version embedded in every Redis key; it changes when the layout does.
// v2: leases (reconcile.lua), buckets per (key, limit), and disjoint namespaces for buckets and the
// limiter's own structures.
const Version = "v2"

// StrictVersion is the layout version of the strict algorithms' keys ("<prefix>:v1:{tag}:rule:alg"),
// which did not change with v2; they never share a name with the hybrid buckets ("<prefix>:v2:b:…")
// or the limiter's internal structures ("<prefix>:v2:x:…").
const StrictVersion = "v1"

// ErrBadPrefix is returned for a key prefix that is empty or contains a '{', '}' or whitespace.
var ErrBadPrefix = errors.New("central: key prefix must be non-empty and contain no braces or spaces")

// validPrefix reports whether p can start a key without disturbing the hash tag that follows it.
func validPrefix(p string) bool {
	return p != "" && !strings.ContainsAny(p, "{} \t\r\n")
}

// The namespaces under "<prefix>:v2:". User keys only ever appear after "b:" (buckets); the limiter's
// own structures live under "x:", which no user key can reach.
const (
	bucketSpace   = ":" + Version + ":b:"
	internalSpace = ":" + Version + ":x:"
)

// BucketKey returns the Redis key of the global bucket for key under lim:
// "<prefix>:v2:b:{<key>}:<rate>:<burst>". The key is the hash tag, so in a Cluster every bucket of one
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

// Slot returns the Redis Cluster slot of a Redis key, with the hash-tag rule: if the key has a '{'
// followed later by a '}' with at least one byte between them, only those bytes are hashed.
func Slot(redisKey string) int {
	s := redisKey
	if i := strings.IndexByte(s, '{'); i >= 0 {
		if j := strings.IndexByte(s[i+1:], '}'); j > 0 {
			s = s[i+1 : i+1+j]
		}
	}
	return int(crc16(s) & 16383)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021), the checksum Redis Cluster uses for slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// Bucket is the state of a global bucket as reconcile.lua stores it in the bucket's "b" field.
type Bucket struct {
	Tokens   int64   // tokens in the bucket, micro-tokens (negative: debt)
	Refilled int64   // time of the last refill, µs of Redis TIME
	Consumed int64   // tokens admitted in total, as the nodes reported them
	Demand   float64 // the key's demand, tokens/s, as the active nodes declared it
}

// BucketField is the hash field of a bucket's state; see [ParseBucket].
const BucketField = "b"

// ParseBucket decodes a bucket's "b" field ("t:s:c:w:nt:x"), for tests and admin tools.
func ParseBucket(b string) (Bucket, error) {
	p := strings.Split(b, ":")
	if len(p) != 6 {
		return Bucket{}, fmt.Errorf("%w: bucket field %q", ErrBadReply, b)
	}
	t, err1 := strconv.ParseInt(p[0], 10, 64)
	s, err2 := strconv.ParseInt(p[1], 10, 64)
	c, err3 := strconv.ParseInt(p[2], 10, 64)
	w, err4 := strconv.ParseFloat(p[3], 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Bucket{}, fmt.Errorf("%w: bucket field %q: %v", ErrBadReply, b, err)
	}
	return Bucket{Tokens: t, Refilled: s, Consumed: c, Demand: w}, nil
}
