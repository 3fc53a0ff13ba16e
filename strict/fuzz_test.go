package strict

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// FuzzDecode: decode never panics, whatever the reply's shape, and what it accepts is within the
// contract of Decision (a bad reply is an error wrapping ErrBadReply, never a wrong answer).
func FuzzDecode(f *testing.F) {
	f.Add(uint8(1), int64(10), []byte{0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9})
	f.Add(uint8(2), int64(5), []byte{1, 2, 3})
	f.Add(uint8(1), int64(1), []byte{})
	f.Add(uint8(0), int64(10), []byte{2, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0,
		3, 0, 0, 0xc1, 0x6f, 0xf2, 0x86, 0x23, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0}) // a wait of 1e16µs
	f.Fuzz(func(t *testing.T, rules uint8, limit int64, b []byte) {
		n := int(rules%4) + 1
		if limit < 1 {
			limit = 1
		}
		// The reply: one element per 9 bytes, the first byte choosing its type.
		var vals []any
		for len(b) >= 9 {
			v := int64(binary.LittleEndian.Uint64(b[1:9]))
			switch b[0] % 8 {
			case 0:
				vals = append(vals, "x")
			case 1:
				vals = append(vals, nil)
			case 2:
				vals = append(vals, v%3) // small numbers, so the shape is often right
			case 3:
				vals = append(vals, v)
			default:
				vals = append(vals, v%(limit+2))
			}
			b = b[9:]
		}
		var res any = vals
		if len(b) == 1 {
			res = "not an array"
		}
		out := make([]Decision, n)
		all, err := decode(res, out, func(int) int64 { return limit }, nil)
		if err != nil {
			if !errors.Is(err, ErrBadReply) {
				t.Fatalf("decode error %v does not wrap ErrBadReply", err)
			}
			return
		}
		for i, r := range out {
			if r.Limit != limit || r.Remaining < 0 || r.Remaining > limit || r.RetryAfter < 0 || r.ResetAfter < 0 ||
				r.RetryAfter > 1e15*time.Microsecond || r.ResetAfter > 1e15*time.Microsecond {
				t.Fatalf("result %d out of range: %+v (limit %d)", i, r, limit)
			}
			if all && !r.Allowed {
				t.Fatalf("all allowed, but rule %d denied", i)
			}
		}
	})
}
