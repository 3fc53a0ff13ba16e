package central

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/lua"
)

var _ redis.Error = replyErr("")

// Fuzz targets for the parts of central that take untrusted input: ban messages from Pub/Sub,
// script replies from Redis, and limiter keys. Each runs its seeds (f.Add and testdata/fuzz) in a
// plain go test; go test -fuzz=FuzzX ./central/ explores further.

// FuzzParseBanMessage: any payload is either rejected or decoded into a sensible event that
// survives a round trip through the format the ban script publishes; and every message the script
// can publish (any key, any duration in range) decodes to what was published.
func FuzzParseBanMessage(f *testing.F) {
	for _, s := range []string{"b 1000 user:1", "u 0 user:1", "b 1 a b c", "b 0 k", "u 5 k", "x 1 k", "b 1000", "b  k",
		"b -1 k", "b 1e3 k", "b 1000000000001 k", "b 999999999999 \x00{}", "", " ", "b 10 ", "u 0 "} {
		f.Add(s, int64(60_000))
	}
	f.Fuzz(func(t *testing.T, payload string, ms int64) {
		ev, err := ParseBanMessage(payload)
		if err == nil {
			switch {
			case ev.Banned && (ev.TTL < time.Millisecond || ev.TTL > 1e12*time.Millisecond):
				t.Fatalf("%q: ban TTL %v out of range", payload, ev.TTL)
			case !ev.Banned && ev.TTL != 0:
				t.Fatalf("%q: unban with a TTL %v", payload, ev.TTL)
			case !strings.HasSuffix(payload, " "+ev.Key):
				t.Fatalf("%q: key %q is not the end of the payload", payload, ev.Key)
			}
			again, err := ParseBanMessage(format(ev))
			if err != nil || again != ev {
				t.Fatalf("%q: round trip %q gave %+v, %v; want %+v", payload, format(ev), again, err, ev)
			}
		}
		// What the ban script publishes: string.format('b %d ', ms) .. key, and 'u 0 ' .. key.
		key := payload
		if ms >= 1 && ms <= 1e12 {
			ev, err := ParseBanMessage(fmt.Sprintf("b %d ", ms) + key)
			if err != nil || !ev.Banned || ev.Key != key || ev.TTL != time.Duration(ms)*time.Millisecond {
				t.Fatalf("ban of %q for %dms: %+v, %v", key, ms, ev, err)
			}
		}
		ev, err = ParseBanMessage("u 0 " + key)
		if err != nil || ev.Banned || ev.Key != key {
			t.Fatalf("unban of %q: %+v, %v", key, ev, err)
		}
	})
}

func format(ev BanEvent) string {
	if ev.Banned {
		return fmt.Sprintf("b %d %s", ev.TTL.Milliseconds(), ev.Key)
	}
	return "u 0 " + ev.Key
}

// replyErr stands for an error reply nested in an array (go-redis's own type is internal).
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// replyFrom builds a go-redis-like reply value from fuzz bytes: integers, strings, nils, error
// replies, RESP3 doubles, booleans and maps, and nested arrays, as go-redis's Cmd.Val can hold.
func replyFrom(b []byte, depth int) (any, []byte) {
	if len(b) == 0 {
		return nil, b
	}
	tag, b := b[0], b[1:]
	switch tag % 8 {
	case 0, 1, 2: // integers are what a good reply holds: make them likely
		var buf [8]byte
		n := copy(buf[:], b)
		v := int64(binary.LittleEndian.Uint64(buf[:]))
		if tag%8 != 0 { // small values too
			v = int64(int8(buf[0]))
		}
		return v, b[min(n, 8):]
	case 3:
		n := 0
		if len(b) > 0 {
			n, b = int(b[0]%16), b[1:]
		}
		n = min(n, len(b))
		return string(b[:n]), b[n:]
	case 4:
		return replyErr("ERR fuzz"), b
	case 5:
		var buf [8]byte
		n := copy(buf[:], b)
		return math.Float64frombits(binary.LittleEndian.Uint64(buf[:])), b[min(n, 8):]
	case 6:
		if depth > 3 || len(b) == 0 {
			return true, b
		}
		m := map[any]any{}
		var k, v any
		k, b = replyFrom(b, depth+1)
		v, b = replyFrom(b, depth+1)
		if k, ok := k.(string); ok {
			m[k] = v
		}
		return m, b
	default:
		if depth > 3 || len(b) == 0 {
			return []any(nil), b
		}
		n := int(b[0] % 32)
		b = b[1:]
		arr := make([]any, 0, n)
		for i := 0; i < n && len(b) > 0; i++ {
			var v any
			v, b = replyFrom(b, depth+1)
			arr = append(arr, v)
		}
		return arr, b
	}
}

// FuzzDecodeStates: decodeStates never panics on any reply shape; it accepts a reply only when it
// is exactly 6 elements per key in range (or a per-key error row), and then decodes them faithfully,
// with durations that are never negative. The second half builds well-formed replies from the fuzz
// integers and checks the round trip.
func FuzzDecodeStates(f *testing.F) {
	good := func(vals ...int64) []byte {
		b := []byte{7, byte(len(vals))}
		for _, v := range vals {
			b = append(b, 0)
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
		return b
	}
	f.Add(good(1, 5, 6_000_000, 1000, 0, 8_000_000), uint8(1))
	f.Add(good(0, 5, -250_000, 3000, 500_000, 1_000_000, -1, 9, 10_000_000, 1, 0, 0), uint8(2))
	f.Add(good(1, 5, 6_000_000, 1, 0), uint8(1))               // short
	f.Add(good(2, 5, 6_000_000, 1, 0, 8_000_000), uint8(1))    // banned
	f.Add(good(3, 5, 6_000_000, 1, 0, 8_000_000), uint8(1))    // status out of range
	f.Add(good(1, 5, 6_000_000, -1, 0, 8_000_000), uint8(1))   // negative demand
	f.Add(good(0, 5, 6_000_000, 1, 1e16, 8_000_000), uint8(1)) // a retry-after beyond the script's clamp
	f.Add(good(0, 5, 6_000_000, 1, math.MaxInt64, math.MaxInt64), uint8(1))
	f.Add([]byte{7, 6, 3, 1, 'x', 0, 0, 0, 0, 0, 0, 0, 0, 0}, uint8(1)) // a string among the integers
	f.Add([]byte{4}, uint8(0))
	f.Add([]byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, keys uint8) {
		res, _ := replyFrom(data, 0)
		out := make([]State, keys%9)
		errs := make([]error, len(out))
		err := decodeStates(res, out, errs)
		vals, isArr := res.([]any)
		if err != nil {
			if !errors.Is(err, ErrBadReply) {
				t.Fatalf("error %v does not wrap ErrBadReply", err)
			}
		} else {
			if !isArr || len(vals) != replyWidth*len(out) {
				t.Fatalf("accepted %#v for %d keys", res, len(out))
			}
			for k, st := range out {
				if errs[k] != nil {
					if !errors.Is(errs[k], ErrBadKey) || vals[replyWidth*k] != int64(-3) {
						t.Fatalf("key error %v from %v", errs[k], vals[replyWidth*k:replyWidth*k+replyWidth])
					}
					continue
				}
				checkState(t, st, vals[replyWidth*k:replyWidth*k+replyWidth])
			}
		}
		// Well-formed replies built from the fuzz integers round-trip.
		var ints []int64
		for i := 0; i+8 <= len(data); i += 8 {
			ints = append(ints, int64(binary.LittleEndian.Uint64(data[i:])))
		}
		n := len(ints) / replyWidth
		reply := make([]any, 0, replyWidth*n)
		for k := range n {
			v := ints[replyWidth*k : replyWidth*k+replyWidth]
			reply = append(reply, abs(v[0])%5-2, abs(v[1]), v[2], abs(v[3]), abs(v[4])%1_000_000_000_000_001, abs(v[5])%1_000_000_000_000_001)
		}
		out = make([]State, n)
		errs = make([]error, n)
		if err := decodeStates(reply, out, errs); err != nil {
			t.Fatalf("a well-formed reply %v was rejected: %v", reply, err)
		}
		for k, st := range out {
			checkState(t, st, reply[replyWidth*k:replyWidth*k+replyWidth])
		}
	})
}

func abs(v int64) int64 {
	if v < 0 {
		if v == math.MinInt64 {
			return math.MaxInt64
		}
		return -v
	}
	return v
}

// checkState checks that st is the faithful decoding of the reply values vals.
func checkState(t *testing.T, st State, vals []any) {
	t.Helper()
	var v [replyWidth]int64
	for j := range v {
		x, ok := vals[j].(int64)
		if !ok {
			t.Fatalf("accepted a %T in %v", vals[j], vals)
		}
		v[j] = x
	}
	switch {
	case st.Status < -2 || st.Status > 2 || int64(st.Status) != v[0]:
		t.Fatalf("status %d from %v", st.Status, v)
	case st.Charged != v[1] || st.Tokens != v[2] || st.Demand != float64(v[3])/1000 || st.Demand < 0:
		t.Fatalf("state %+v from %v", st, v)
	case st.RetryAfter < 0 || st.ResetAfter < 0:
		t.Fatalf("negative duration in %+v from %v", st, v)
	case st.RetryAfter != time.Duration(v[4])*time.Microsecond || st.ResetAfter != time.Duration(v[5])*time.Microsecond:
		t.Fatalf("durations %+v from %v", st, v)
	}
}

// refSlot is an independent implementation of Redis's keyHashSlot (cluster.c): a table-driven
// CRC16/XMODEM and the hash-tag rule, written from the specification rather than from Slot.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func refSlot(key []byte) int {
	s := -1
	for i, c := range key {
		if c == '{' {
			s = i
			break
		}
	}
	if s >= 0 {
		for e := s + 1; e < len(key); e++ {
			if key[e] == '}' {
				if e > s+1 {
					key = key[s+1 : e]
				}
				break
			}
		}
	}
	var crc uint16
	for _, c := range key {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^c]
	}
	return int(crc & 16383)
}

// FuzzSlot: BucketKey keeps the limiter key recoverable (so two keys never share a bucket), the
// bucket's slot is the one Redis computes (checked against refSlot here, and against a real
// cluster's CLUSTER KEYSLOT for the seeds in TestCluster), and a key without braces hashes as itself.
func FuzzSlot(f *testing.F) {
	for _, k := range slotSeeds {
		f.Add("hr", k)
	}
	f.Add("a:b", "x")
	f.Add("", "k")
	f.Add("p{", "k")
	f.Fuzz(func(t *testing.T, prefix, key string) {
		if got := redisx.Slot(prefix); got != refSlot([]byte(prefix)) {
			t.Fatalf("Slot(%q) = %d, want %d", prefix, got, refSlot([]byte(prefix)))
		}
		if !redisx.ValidPrefix(prefix) {
			return
		}
		rk := BucketKey(prefix, key)
		head := prefix + ":" + Version + ":b:{"
		if !strings.HasPrefix(rk, head) || !strings.HasSuffix(rk, "}") || rk[len(head):len(rk)-len("}")] != key {
			t.Fatalf("BucketKey(%q, %q) = %q: the key cannot be recovered", prefix, key, rk)
		}
		slot := redisx.Slot(rk)
		if slot < 0 || slot > 16383 || slot != refSlot([]byte(rk)) {
			t.Fatalf("Slot(%q) = %d, want %d", rk, slot, refSlot([]byte(rk)))
		}
		if key != "" && !strings.ContainsAny(key, "{}") && slot != int(redisx.CRC16(key)&16383) {
			t.Fatalf("Slot(%q) = %d: a key without braces is its own hash tag", rk, slot)
		}
		if redisx.Slot(BansKey(prefix)) != int(redisx.CRC16("bans")&16383) {
			t.Fatalf("BansKey(%q) is not in the slot of {bans}", prefix)
		}
	})
}

// FuzzParseBucket: any field is either rejected or decoded into whole numbers (the demand aside);
// and every field reconcile.lua can write, packed (Redis) or as text (miniredis), decodes to the
// values written.
func FuzzParseBucket(f *testing.F) {
	f.Add("", int64(0), int64(0), int64(0), int64(0), int64(0), int64(0))
	f.Add("-5000000:18c2a3b4c5d6e:13:13880:18c2a3b4c5d6e:18c2a3b4c5", int64(-5_000_000), int64(1_700_000_000_123_456),
		int64(13), int64(80_000), int64(1_700_000_001_000_000), int64(1_700_000_000_123))
	f.Add(strings.Repeat("0", 37), int64(1e15), int64(0), int64(1), int64(1), int64(1), int64(1))
	f.Add("1:2:3:4:5", int64(-2e15), int64(1<<53), int64(0), int64(1e12), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, field string, tok, ts, con, wm, nt, x int64) {
		if b, err := ParseBucket(field); err == nil && (math.IsNaN(b.Demand) || math.IsInf(b.Demand, 0)) {
			t.Fatalf("%q: demand %v", field, b.Demand)
		}
		// What the script writes: tokens down to -(burst + rate·advance) ≥ -2e15 micro-tokens, the
		// times and counts non-negative, all below 2^53; w below 2^40 milli-tokens/s, x below 2^47 ms,
		// nt within 2^39-1 µs of s (layout v6's widths).
		clamp := func(v, lo, hi int64) int64 { return min(max(v, lo), hi) }
		tok, ts, con, wm, x = clamp(tok, -2e15, 1<<53-1), clamp(ts, 0, 1<<53-1), clamp(con, 0, 1<<53-1),
			clamp(wm, 0, 1<<40-1), clamp(x, 0, 1<<47-1)
		nt = clamp(nt, max(ts-(1<<39-1), 0), ts+(1<<39-1))
		want := Bucket{Tokens: tok, Refilled: ts, Consumed: con, Demand: float64(wm) / 1000, NextScan: nt, TTLSet: x}
		text := fmt.Sprintf("%d:%x:%d:%x:%x:%x", tok, ts, con, wm, nt, x)
		packed := make([]byte, 0, bucketPacked)
		for i, v := range []int64{tok, ts, con, wm, nt - ts, x} {
			packed = binary.LittleEndian.AppendUint64(packed, uint64(v))[:len(packed)+[6]int{7, 7, 7, 5, 5, 6}[i]]
		}
		for _, s := range []string{text, string(packed)} {
			got, err := ParseBucket(s)
			if err != nil {
				t.Fatalf("%q: %v", s, err)
			}
			if got != want {
				t.Fatalf("%q: got %+v, want %+v", s, got, want)
			}
		}
	})
}

// FuzzReconcileArgument: reconcile.lua reads a key's argument (ten float64s) with struct.unpack on
// Redis and with its own decoder where Lua has no struct library (gopher-lua, miniredis). Any 80
// bytes must be rejected alike by both (the key fails with "bad <value>", nothing else does) or
// applied alike (the same status and charge); and any other length is rejected. It needs a real
// redis-server (skipped without one, outside CI).
func FuzzReconcileArgument(f *testing.F) {
	real := redistest.Start(f).Client(f)
	m := miniredis.RunT(f)
	mini := redis.NewClient(&redis.Options{Addr: m.Addr()})
	f.Cleanup(func() { _ = mini.Close() })
	src := redis.NewScript(lua.StripShebang(lua.Reconcile()))
	for _, v := range [][]float64{
		{1, 0, 0, 0, 0, 1, 1, 1, 1, 10},
		{1, 5, 0, 5, 0, 12.5, 20, 0, 1000, 500},
		{1 << 53, 1 << 53, 1 << 53, 1 << 53, 1 << 53, 1e9, 1e9, 1e9, 1e9, 1e9},
		{math.Copysign(0, -1), 0, 0, 0, 0, 5e-324, 0, 0, 1e-9, 1},
		{1, 0, 0, 0, 0, math.SmallestNonzeroFloat64 * 3, 1, 1, 2.2250738585072014e-308, 7},
		{1, math.Inf(-1), 0, 0, 0, 1, 1, 1, 1, 10},
		{3, 2, 1, 1, 0, 0.001, 4, 1, 0.5, 3},
	} {
		f.Add(packed(v...))
	}
	f.Add([]byte("short"))
	f.Fuzz(func(t *testing.T, arg []byte) {
		// The bytes as given (mostly of another length), and cut or zero-padded to 80 bytes.
		for _, a := range [][]byte{arg, append(arg[:min(len(arg), argBytes):min(len(arg), argBytes)], make([]byte, max(argBytes-len(arg), 0))...)} {
			compareEngines(t, src, real, mini, a)
		}
	})
}

// compareEngines runs reconcile.lua on a new bucket with the key argument arg on real Redis and on
// miniredis, and checks that both reject it alike or apply it alike (FuzzReconcileArgument).
func compareEngines(t *testing.T, src *redis.Script, real, mini redis.UniversalClient, arg []byte) {
	ctx := context.Background()
	key := "f:" + Version + ":b:{fuzz}:1:10"
	var out [2]State
	var errs [2]error
	for i, rdb := range []redis.UniversalClient{real, mini} {
		require.NoError(t, rdb.Del(ctx, key).Err())
		res, err := src.Run(ctx, rdb, []string{key}, NodeField("node"), 60000, 1000, 4000, 4000, 0, 0, t0, arg).Result()
		require.NoError(t, err, "a key's argument fails that key only")
		o, e := make([]State, 1), make([]error, 1)
		require.NoError(t, decodeStates(res, o, e))
		out[i], errs[i] = o[0], e[0]
	}
	if len(arg) != argBytes {
		require.ErrorIs(t, errs[0], ErrBadKey)
	}
	if errs[0] != nil || errs[1] != nil {
		require.ErrorIs(t, errs[0], ErrBadKey, "%x", arg)
		require.ErrorIs(t, errs[1], ErrBadKey, "%x", arg)
		assert.Equal(t, errs[0].Error(), errs[1].Error(), "both engines reject the same value: %x", arg)
		return
	}
	assert.Equal(t, out[0].Status, out[1].Status, "%x", arg)
	assert.Equal(t, out[0].Charged, out[1].Charged, "%x", arg)
}

// TestNodeField: a node id of 16 lower-case hexadecimal digits is stored as its 8 bytes after "m",
// any other as "n:" and the id; the two forms never meet, and IsNodeField knows both.
func TestNodeField(t *testing.T) {
	ids := []string{"0123456789abcdef", "0123456789ABCDEF", "6e3a616263646566", "abcdef", "a",
		"0123456789abcde", "0123456789abcdef0", "node-1", strings.Repeat("z", 64)}
	seen := map[string]string{}
	for _, id := range ids {
		f := NodeField(id)
		if !IsNodeField(f) {
			t.Errorf("%q: field %q is not a node field", id, f)
		}
		if o, ok := seen[f]; ok {
			t.Errorf("%q and %q share field %q", id, o, f)
		}
		seen[f] = id
	}
	if f := NodeField("0123456789abcdef"); f != "m\x01\x23\x45\x67\x89\xab\xcd\xef" {
		t.Errorf("packed field %q", f)
	}
	if f := NodeField("0123456789ABCDEF"); f != "n:0123456789ABCDEF" {
		t.Errorf("upper-case id: field %q, want the text form", f)
	}
	for _, f := range []string{"b", "o", "ban", BucketField, BanField} {
		if IsNodeField(f) {
			t.Errorf("%q taken for a node field", f)
		}
	}
}
