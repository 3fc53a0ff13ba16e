package concurrency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/hybridrate/hybridrate/lua"
	"github.com/redis/go-redis/v9"
)

// keySpace is the namespace of this package's keys under the prefix: "<prefix>:v1:c:{<key>}". Package
// hybrid's keys are "<prefix>:v5:b:…" and "<prefix>:v3:x:…", the strict algorithms'
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

// errBadReply is a reply of an unexpected shape.
var errBadReply = errors.New("concurrency: unexpected reply from Redis")

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

// script runs concurrency.lua, by EVALSHA with a fallback to EVAL, and without its "#!lua" line on a
// server that predates script flags.
type script struct {
	std, legacy *redis.Script
	useLegacy   atomic.Bool // the server rejected the #!lua line
}

func newScript() *script {
	src := lua.Concurrency()
	return &script{std: redis.NewScript(src), legacy: redis.NewScript(lua.StripShebang(src))}
}

// run calls the script on rkey and decodes its reply.
func (s *script) run(ctx context.Context, rdb redis.Scripter, rkey, op, id string, limit int, ttlMS int64) (reply, error) {
	keys := []string{rkey}
	args := []any{op, id, strconv.Itoa(limit), strconv.FormatInt(ttlMS, 10)}
	for attempt := 0; ; attempt++ {
		legacy := s.useLegacy.Load()
		sc := s.std
		if legacy {
			sc = s.legacy
		}
		res, err := sc.Run(ctx, rdb, keys, args...).Result()
		if err != nil && attempt == 0 && !legacy && isShebangUnsupported(err) {
			s.useLegacy.Store(true)
			continue
		}
		if err != nil {
			return reply{}, err
		}
		return decodeReply(res)
	}
}

// isShebangUnsupported reports whether err is a server's complaint about the "#!lua" first line.
func isShebangUnsupported(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.Contains(msg, "compiling script") && strings.Contains(msg, "'#'")
}
