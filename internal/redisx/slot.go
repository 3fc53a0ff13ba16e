package redisx

import "strings"

// Slot returns the Redis Cluster slot of a Redis key, with the hash-tag rule: if the key has a '{'
// followed later by a '}' with at least one byte between them, only those bytes are hashed.
func Slot(redisKey string) int {
	s := redisKey
	if i := strings.IndexByte(s, '{'); i >= 0 {
		if j := strings.IndexByte(s[i+1:], '}'); j > 0 {
			s = s[i+1 : i+1+j]
		}
	}
	return int(CRC16(s) & 16383)
}

// CRC16 is CRC-16/XMODEM (polynomial 0x1021), the checksum Redis Cluster uses for slots.
func CRC16(s string) uint16 {
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
