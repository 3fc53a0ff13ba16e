package central

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/hybridrate/hybridrate/internal/redisx"
)

// Version is the key-layout version of the buckets, embedded in every bucket's Redis key; it changes
// when their layout does. v2: leases (reconcile.lua), buckets per (key, limit), and disjoint
// namespaces for buckets and the limiter's own structures. v3: the same model in cheaper records
// (hexadecimal numbers in the bucket field, node records packed with struct.pack where Redis has
// it). v4: the bucket field packed with struct.pack too (reconcile.lua). v5: one bucket per key,
// whatever its limit (the limit travels in the scripts' arguments, so a changed rate or burst keeps
// the key's consumption), with the key's ban in the bucket (field "x", see [BanField]). v6: the same
// fields in fewer bytes (issue 24): integers of the width they need in the bucket field (37 bytes
// instead of 48) and in the node records (32 instead of 40), and a node id of 16 hexadecimal digits
// stored as its 8 bytes in its record's field name ([NodeField]); v5 is not read. The keys of
// package strict ("<prefix>:v1:{tag}:…", strict.Version) never share a name with them.
const Version = "v6"

// internalVersion is the layout version of the limiter's own structures (the ban list and its
// change log). Their layout has not changed since v3, so they keep their v3 names: bans survive an
// upgrade from v3.
const internalVersion = "v3"

// ErrBadPrefix is returned for a key prefix that is empty or contains a '{', '}' or whitespace.
var ErrBadPrefix = redisx.NewError(redisx.ClassInvalid, "central: key prefix must be non-empty and contain no braces or spaces")

// The namespaces: buckets under "<prefix>:v6:b:", the limiter's own structures under "<prefix>:v3:x:".
// User keys only ever appear after "b:"; no user key can reach the "x:" namespace, and a bucket's
// name never starts like an internal one (the versions differ, and so do "b:" and "x:").
const (
	bucketSpace   = ":" + Version + ":b:"
	internalSpace = ":" + internalVersion + ":x:"
)

// BucketKey returns the Redis key of the global bucket for key: "<prefix>:v6:b:{<key>}". The key is
// the hash tag, so in a Cluster a bucket and everything of its key live in one slot. Any key is
// accepted, including one with braces or NUL bytes: two different keys always give two different
// Redis keys, and none of them can equal [BansKey] or any other key of the limiter's own.
//
// The limit is not part of the name: it travels in each call's arguments (reconcile.lua, take.lua),
// so a key whose limit changes keeps its bucket and the consumption in it. Each call refills the
// bucket at the rate it sends, from the bucket's last write, and clamps it to the burst it sends:
// nodes that send different limits for one key (a rolling deploy, a policy reload on some nodes
// first) count in one bucket, and the limit of the latest call applies (docs/accuracy.md, "One key,
// two limits").
func BucketKey(prefix, key string) string {
	return prefix + bucketSpace + "{" + key + "}"
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
	NextScan int64   // when the node records are next scanned, µs of Redis TIME
	TTLSet   int64   // when the key's TTL was last set, ms of Redis TIME
}

// BucketField is the hash field of a bucket's state; see [ParseBucket].
const BucketField = "b"

// BanField is the hash field of a bucket that holds its key's ban, if any: the ban's deadline in ms
// of Redis TIME, in decimal (bucketban.lua; [Client.Ban]).
const BanField = "ban"

// bucketPacked is the length of a bucket field packed with struct.pack("<i7I7I7I5i5i6").
const bucketPacked = 37

// NodeField returns the hash field of the node record that the node with id keeps in every bucket it
// leases from (reconcile.lua): "m" and the id's 8 bytes for an id of 16 lower-case hexadecimal
// digits (hybrid's random ids), else "n:" and the id. The two forms start with different bytes and
// each is one-to-one, so no two ids share a field.
func NodeField(id string) string {
	if len(id) == 16 {
		if b, err := hex.DecodeString(id); err == nil && hex.EncodeToString(b) == id {
			return "m" + string(b)
		}
	}
	return "n:" + id
}

// IsNodeField reports whether a bucket's hash field f is a node record's ([NodeField]).
func IsNodeField(f string) bool {
	return len(f) == 9 && f[0] == 'm' || strings.HasPrefix(f, "n:")
}

// ParseBucket decodes a bucket's "b" field, for tests and admin tools. On Redis the field is 37
// bytes of little-endian integers (struct.pack("<i7I7I7I5i5i6"): tokens, refill time, consumed,
// demand in milli-tokens/s, next scan as its offset from the refill time, TTL set); where Redis's
// Lua has no struct library (miniredis, in tests) it is the text "t:s:c:w:nt:x", t and c decimal,
// the others hexadecimal, w in milli-tokens/s (reconcile.lua).
func ParseBucket(b string) (Bucket, error) {
	if p := strings.Split(b, ":"); len(p) == 6 {
		t, err1 := strconv.ParseInt(p[0], 10, 64)
		s, err2 := strconv.ParseInt(p[1], 16, 64)
		c, err3 := strconv.ParseInt(p[2], 10, 64)
		w, err4 := strconv.ParseInt(p[3], 16, 64)
		nt, err5 := strconv.ParseInt(p[4], 16, 64)
		x, err6 := strconv.ParseInt(p[5], 16, 64)
		err := errors.Join(err1, err2, err3, err4, err5, err6)
		if err == nil {
			return Bucket{Tokens: t, Refilled: s, Consumed: c, Demand: float64(w) / 1000, NextScan: nt, TTLSet: x}, nil
		}
		if len(b) != bucketPacked {
			return Bucket{}, fmt.Errorf("%w: bucket field %q: %v", ErrBadReply, b, err)
		}
		// 48 bytes with five colons that do not parse as text: packed.
	}
	if len(b) != bucketPacked {
		return Bucket{}, fmt.Errorf("%w: bucket field %q", ErrBadReply, b)
	}
	// Little-endian integers of 7, 7, 7, 5, 5 and 6 bytes: t, s, c (signed, unsigned, unsigned), w in
	// milli-tokens/s (unsigned), nt - s and x (signed).
	var v [6]int64
	off := 0
	for i, w := range [6]int{7, 7, 7, 5, 5, 6} {
		var buf [8]byte
		copy(buf[:], b[off:off+w])
		u := binary.LittleEndian.Uint64(buf[:])
		if signed := i == 0 || i >= 4; signed && u>>(8*w-1) == 1 {
			u |= ^uint64(0) << (8 * w) // sign extension
		}
		v[i] = int64(u)
		off += w
	}
	return Bucket{Tokens: v[0], Refilled: v[1], Consumed: v[2], Demand: float64(v[3]) / 1000,
		NextScan: v[1] + v[4], TTLSet: v[5]}, nil
}

// FleetKey returns the Redis key of the registry of live nodes under prefix (fleet.lua).
func FleetKey(prefix string) string { return prefix + internalSpace + "{fleet}" }

// InternalKey returns "<prefix>:v3:x:<name>": a key in the limiter's own namespace, which no user
// key can reach, for tools that keep their own records next to the limiter's (package observe's
// fleet reports). The names "{bans}", "bans" and "{fleet}" are taken.
func InternalKey(prefix, name string) string { return prefix + internalSpace + name }
