package relay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/limits"
)

// The wire format of a relay's HTTP endpoint (Handler, Remote): little-endian binary, one request
// per POST, versioned by its first byte.
//
//	request:  version(1) node_len(1) node count(u16) then per update:
//	          key_len(u16) key rate(f64) burst(i64) inc(u64) cum(i64) acked(i64) used(i64)
//	          uacked(i64) demand(f64) want(i64) n(i64) flags(1: bit 0 vetted)
//	response: version(1) count(u16) then per answer:
//	          kind(1: 0 state, 1 error, 2 key cap reached) then for a state:
//	          status(i8) charged(i64) tokens(i64) demand(f64) retry_ns(i64) reset_ns(i64)
//	          and for an error: msg_len(u16) msg
const (
	wireVersion   = 2
	maxWireKeys   = 4096             // updates in one request: a node's flush batch
	maxWireKeyLen = limits.MaxKeyLen // the longest limiter key (hybrid.MaxKeyLen)
	updateFixed   = 2 + 8*10 + 1
	stateFixed    = 1 + 1 + 8*5
)

// errWire is wrapped by every error of a malformed request or response.
var errWire = errors.New("relay: malformed message")

func appendRequest(b []byte, node string, updates []central.Update) ([]byte, error) {
	if len(node) == 0 || len(node) > 255 {
		return b, fmt.Errorf("relay: node id of %d bytes: want 1 to 255", len(node))
	}
	if len(updates) > maxWireKeys {
		return b, fmt.Errorf("relay: %d updates in one call: at most %d", len(updates), maxWireKeys)
	}
	b = append(b, wireVersion, byte(len(node)))
	b = append(b, node...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(updates)))
	for _, u := range updates {
		if len(u.Key) > maxWireKeyLen {
			return b, fmt.Errorf("relay: key of %d bytes: at most %d", len(u.Key), maxWireKeyLen)
		}
		b = binary.LittleEndian.AppendUint16(b, uint16(len(u.Key)))
		b = append(b, u.Key...)
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(u.Limit.Rate))
		for _, v := range []uint64{uint64(u.Limit.Burst), u.Inc, uint64(u.Cum), uint64(u.Acked), uint64(u.Used),
			uint64(u.UAcked), math.Float64bits(u.Demand), uint64(u.Want), uint64(u.N)} {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
		var flags byte
		if u.Vetted {
			flags |= 1
		}
		b = append(b, flags)
	}
	return b, nil
}

// parseRequest decodes a request; the updates' numbers are checked by the relay (valid).
func parseRequest(b []byte) (node string, updates []central.Update, err error) {
	if len(b) < 2 || b[0] != wireVersion {
		return "", nil, fmt.Errorf("%w: version", errWire)
	}
	nl := int(b[1])
	b = b[2:]
	if nl == 0 || len(b) < nl+2 {
		return "", nil, fmt.Errorf("%w: node id", errWire)
	}
	node = string(b[:nl])
	n := int(binary.LittleEndian.Uint16(b[nl:]))
	b = b[nl+2:]
	if n > maxWireKeys {
		return "", nil, fmt.Errorf("%w: %d updates", errWire, n)
	}
	updates = make([]central.Update, n)
	for i := range updates {
		if len(b) < 2 {
			return "", nil, fmt.Errorf("%w: update %d", errWire, i)
		}
		kl := int(binary.LittleEndian.Uint16(b))
		if kl > maxWireKeyLen || len(b) < 2+kl+8*10+1 {
			return "", nil, fmt.Errorf("%w: update %d", errWire, i)
		}
		u := &updates[i]
		u.Key = string(b[2 : 2+kl])
		b = b[2+kl:]
		var v [10]uint64
		for j := range v {
			v[j] = binary.LittleEndian.Uint64(b[8*j:])
		}
		b = b[80:]
		u.Limit = central.Limit{Rate: math.Float64frombits(v[0]), Burst: int64(v[1])}
		u.Inc, u.Cum, u.Acked, u.Used, u.UAcked = v[2], int64(v[3]), int64(v[4]), int64(v[5]), int64(v[6])
		u.Demand, u.Want, u.N = math.Float64frombits(v[7]), int64(v[8]), int64(v[9])
		if b[0] > 1 {
			return "", nil, fmt.Errorf("%w: update %d: flags %#x", errWire, i, b[0])
		}
		u.Vetted = b[0]&1 != 0
		b = b[1:]
	}
	if len(b) != 0 {
		return "", nil, fmt.Errorf("%w: %d trailing bytes", errWire, len(b))
	}
	return node, updates, nil
}

func appendResponse(b []byte, out []central.State, errs []error) []byte {
	b = append(b, wireVersion)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(out)))
	for i, st := range out {
		switch {
		case errors.Is(errs[i], ErrFull):
			b = append(b, 2)
		case errs[i] != nil:
			msg := errs[i].Error()
			if len(msg) > 1024 {
				msg = msg[:1024]
			}
			b = append(b, 1)
			b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
			b = append(b, msg...)
		default:
			b = append(b, 0, byte(st.Status))
			for _, v := range []uint64{uint64(st.Charged), uint64(st.Tokens), math.Float64bits(st.Demand),
				uint64(st.RetryAfter), uint64(st.ResetAfter)} {
				b = binary.LittleEndian.AppendUint64(b, v)
			}
		}
	}
	return b
}

// RemoteError is a relay's answer that it could not process a key (a bad update, or Redis's
// error for it), as its message. The zero RemoteError has an empty message. It is a plain value,
// safe to copy and share.
type RemoteError struct{ Msg string }

// Error returns "relay: remote: " and the message. It does no I/O.
func (e *RemoteError) Error() string { return "relay: remote: " + e.Msg }

func parseResponse(b []byte, out []central.State, errs []error) error {
	if len(b) < 3 || b[0] != wireVersion {
		return fmt.Errorf("%w: version", errWire)
	}
	n := int(binary.LittleEndian.Uint16(b[1:]))
	if n != len(out) {
		return fmt.Errorf("%w: %d answers for %d updates", errWire, n, len(out))
	}
	b = b[3:]
	for i := range n {
		if len(b) < 1 {
			return fmt.Errorf("%w: answer %d", errWire, i)
		}
		kind := b[0]
		b = b[1:]
		switch kind {
		case 0:
			if len(b) < stateFixed-1 {
				return fmt.Errorf("%w: answer %d", errWire, i)
			}
			var v [5]uint64
			for j := range v {
				v[j] = binary.LittleEndian.Uint64(b[1+8*j:])
			}
			out[i] = central.State{Status: central.Status(int8(b[0])), Charged: int64(v[0]), Tokens: int64(v[1]),
				Demand: math.Float64frombits(v[2]), RetryAfter: time.Duration(v[3]), ResetAfter: time.Duration(v[4])}
			errs[i] = nil
			b = b[stateFixed-1:]
		case 1:
			if len(b) < 2 || len(b) < 2+int(binary.LittleEndian.Uint16(b)) {
				return fmt.Errorf("%w: answer %d", errWire, i)
			}
			ml := int(binary.LittleEndian.Uint16(b))
			errs[i] = &RemoteError{Msg: string(b[2 : 2+ml])}
			b = b[2+ml:]
		case 2:
			errs[i] = ErrFull
		default:
			return fmt.Errorf("%w: answer kind %d", errWire, kind)
		}
	}
	if len(b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", errWire, len(b))
	}
	return nil
}
