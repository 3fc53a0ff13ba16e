package central

import (
	"errors"
	"strings"
)

// Version is the key-layout version embedded in every Redis key; it changes when the layout does.
const Version = "v1"

// ErrBadPrefix is returned for a key prefix that is empty or contains a '{', '}' or whitespace.
var ErrBadPrefix = errors.New("central: key prefix must be non-empty and contain no braces or spaces")

// validPrefix reports whether p can start a key without disturbing the hash tag that follows it.
func validPrefix(p string) bool {
	return p != "" && !strings.ContainsAny(p, "{} \t\r\n")
}

// BucketKey returns the Redis key of the global bucket for key: "<prefix>:v1:{<key>}". The key is the
// hash tag, so in a Cluster everything about one key lives in one slot. Any key is accepted, including
// one with braces or NUL bytes: two different keys always give two different Redis keys.
func BucketKey(prefix, key string) string {
	return prefix + ":" + Version + ":{" + key + "}"
}

// BansKey returns the Redis key of the ban list.
func BansKey(prefix string) string { return prefix + ":" + Version + ":{bans}" }

// BansChannel returns the Pub/Sub channel that carries ban changes.
func BansChannel(prefix string) string { return prefix + ":" + Version + ":bans" }

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
