// Package peers holds the limiters the load generator compares hybridrate with, as their users
// would write them: a strict central token bucket in Redis (one Lua call per decision), one
// independent in-process token bucket per key, and a per-key map of golang.org/x/time/rate
// limiters. redis_rate is used as it is, by package main.
package peers

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/hybridrate/hybridrate/internal/strictbucket"
)

// StrictSource returns the source of the strict central token-bucket script
// (package internal/strictbucket).
func StrictSource() string { return strictbucket.Source() }

var strictScript = redis.NewScript(strictbucket.Source())

// ErrBadReply means Redis answered the strict bucket with a reply of an unexpected shape.
var ErrBadReply = errors.New("peers: unexpected reply from redis")

// Strict is a strict central token bucket: every decision is one EVALSHA of strict_bucket.lua,
// which refills by Redis TIME, so it is exact across any number of nodes. It is safe for
// concurrent use; the zero Strict is not usable, call [NewStrict].
type Strict struct {
	rdb   redis.Scripter
	rate  string
	burst int64
}

// NewStrict returns a strict bucket over rdb for the limit rate tokens/s, burst tokens.
func NewStrict(rdb redis.Scripter, ratePerSec float64, burst int64) (*Strict, error) {
	if !(ratePerSec > 0 && ratePerSec <= 1e9) || burst < 1 || burst > 1e9 {
		return nil, fmt.Errorf("peers: bad limit rate=%v burst=%d", ratePerSec, burst)
	}
	return &Strict{rdb: rdb, rate: strconv.FormatFloat(ratePerSec, 'g', -1, 64), burst: burst}, nil
}

// StrictKey returns the Redis key of key's bucket under prefix: "<prefix>{<key>}".
func StrictKey(prefix, key string) string { return prefix + "{" + key + "}" }

// StrictResult is the outcome of one [Strict.AllowN].
type StrictResult struct {
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration
}

// AllowN takes n tokens from the bucket stored at redisKey if it holds them.
func (s *Strict) AllowN(ctx context.Context, redisKey string, n int64) (StrictResult, error) {
	return s.result(strictScript.Run(ctx, s.rdb, []string{redisKey}, s.rate, s.burst, n).Result())
}

// AllowAt is AllowN at the time nowMicros (µs, positive) instead of Redis TIME: for the fleet
// simulator, whose nodes run on virtual time.
func (s *Strict) AllowAt(ctx context.Context, redisKey string, n, nowMicros int64) (StrictResult, error) {
	return s.result(strictScript.Run(ctx, s.rdb, []string{redisKey}, s.rate, s.burst, n, nowMicros).Result())
}

func (s *Strict) result(v any, err error) (StrictResult, error) {
	if err != nil {
		return StrictResult{}, err
	}
	vals, ok := v.([]any)
	if !ok || len(vals) != 3 {
		return StrictResult{}, fmt.Errorf("%w: %T", ErrBadReply, v)
	}
	var ints [3]int64
	for i := range ints {
		x, ok := vals[i].(int64)
		if !ok {
			return StrictResult{}, fmt.Errorf("%w: element %d is %T", ErrBadReply, i, vals[i])
		}
		ints[i] = x
	}
	return StrictResult{Allowed: ints[0] == 1, Remaining: ints[1], RetryAfter: time.Duration(ints[2]) * time.Microsecond}, nil
}

// Local is one process's independent token buckets, one per key, with no coordination: N nodes
// running one each admit up to N times the limit. Buckets refill by the time the caller passes.
// It is safe for concurrent use; the zero Local is not usable, call [NewLocal].
type Local struct {
	rate   float64 // tokens per nanosecond
	burst  float64
	seed   maphash.Seed
	shards [64]localShard
}

type localShard struct {
	mu sync.Mutex
	m  map[string]*bucket
	_  [40]byte
}

type bucket struct {
	tokens float64
	last   time.Duration
}

// NewLocal returns empty buckets for the limit rate tokens/s, burst tokens.
func NewLocal(ratePerSec float64, burst int64) *Local {
	l := &Local{rate: ratePerSec / 1e9, burst: float64(burst), seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].m = make(map[string]*bucket)
	}
	return l
}

// AllowN takes n tokens from key's bucket at now (any monotonic time, e.g. since the run started)
// if it holds them. A new bucket is full.
func (l *Local) AllowN(key string, now time.Duration, n int64) bool {
	sh := &l.shards[maphash.String(l.seed, key)&63]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b := sh.m[key]
	if b == nil {
		b = &bucket{tokens: l.burst, last: now}
		sh.m[key] = b
	}
	if now > b.last {
		b.tokens = math.Min(l.burst, b.tokens+float64(now-b.last)*l.rate)
		b.last = now
	}
	if b.tokens < float64(n) {
		return false
	}
	b.tokens -= float64(n)
	return true
}

// XRate is a per-key map of golang.org/x/time/rate limiters behind one mutex, as users write it.
// It is safe for concurrent use; the zero XRate is not usable, call [NewXRate].
type XRate struct {
	mu    sync.Mutex
	m     map[string]*rate.Limiter
	limit rate.Limit
	burst int
}

// NewXRate returns an empty map for the limit ratePerSec tokens/s, burst tokens.
func NewXRate(ratePerSec float64, burst int64) *XRate {
	return &XRate{m: make(map[string]*rate.Limiter), limit: rate.Limit(ratePerSec), burst: int(burst)}
}

// AllowN reports whether n tokens may be taken for key now, and takes them if so.
func (x *XRate) AllowN(key string, n int64) bool {
	x.mu.Lock()
	l := x.m[key]
	if l == nil {
		l = rate.NewLimiter(x.limit, x.burst)
		x.m[key] = l
	}
	x.mu.Unlock()
	return l.AllowN(time.Now(), int(n))
}
