package concurrency

import (
	"fmt"

	"github.com/hybridrate/hybridrate/internal/redisx"
	"github.com/hybridrate/hybridrate/lua"
)

// keySpace is the namespace of this package's keys under the prefix: "<prefix>:v1:c:{<key>}". Package
// hybrid's keys are "<prefix>:v6:b:…" and "<prefix>:v3:x:…", the strict algorithms'
// "<prefix>:v1:{…", so no key of this package can name any of theirs, whatever the user key holds.
const keySpace = ":" + Layout + ":c:{"

// redisKey returns the Redis key of key's lease set. The user key is the hash tag (up to its first
// '}', if it has one): one call touches one key, so any slot will do. Two different keys always give
// two different Redis keys.
func redisKey(prefix, key string) string { return prefix + keySpace + key + "}" }

// The operations of concurrency.lua.
const (
	opAcquire = "a"
	opRelease = "r"
	opExtend  = "e"
	opCount   = "n"
)

// errBadReply is a reply of an unexpected shape; it wraps redisx.ErrBadReply.
var errBadReply = fmt.Errorf("concurrency: %w", redisx.ErrBadReply)

// reply is concurrency.lua's reply.
type reply struct {
	ok       bool  // status 1
	inFlight int   // unexpired leases of the key after the call
	waitMS   int64 // acquire denied: ms until the earliest lease expires
}

// decodeReply is the only decoder of concurrency.lua's reply.
func decodeReply(v any) (reply, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 3 {
		return reply{}, fmt.Errorf("%w: %T %v", errBadReply, v, v)
	}
	var n [3]int64
	for i := range n {
		x, ok := a[i].(int64)
		if !ok {
			return reply{}, fmt.Errorf("%w: element %d is %T", errBadReply, i, a[i])
		}
		n[i] = x
	}
	if (n[0] != 0 && n[0] != 1) || n[1] < 0 || n[1] > 1<<31 || n[2] < 0 {
		return reply{}, fmt.Errorf("%w: %v", errBadReply, n)
	}
	return reply{ok: n[0] == 1, inFlight: int(n[1]), waitMS: n[2]}, nil
}

// script is concurrency.lua, run by a redisx.Runner.
var script = redisx.NewScript(lua.Concurrency())
