package redisx

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/internal/limits"
	"github.com/hybridrate/hybridrate/lua"
)

// Script is a Lua script in two variants: as written, with its "#!lua" first line (Redis 7 then
// enforces the declared keys in a Cluster), and without it, for servers that reject the line (Redis
// before 7, miniredis). A [Runner] picks the variant. Create it with [NewScript]; it is immutable.
type Script struct {
	std    *redis.Script
	legacy *redis.Script
}

// NewScript returns the script of src; the SHA-1 of each variant is computed once, here.
func NewScript(src string) *Script {
	return &Script{std: redis.NewScript(src), legacy: redis.NewScript(lua.StripShebang(src))}
}

// Runner runs [Script]s on one Redis deployment and remembers whether it accepts the "#!lua" line.
// The zero Runner is ready to use and counts nothing; it is safe for concurrent use.
type Runner struct {
	// Commands, if not nil, counts the script calls sent: every EVALSHA and every EVAL.
	Commands *atomic.Int64
	// Loads, if not nil, counts the script (re)loads: an EVAL after NOSCRIPT, and every Load.
	Loads *atomic.Int64

	legacy atomic.Bool // the server rejected the "#!lua" line: use the scripts without it
}

// Legacy reports whether the runner has switched to the scripts without their "#!lua" line.
func (r *Runner) Legacy() bool { return r.legacy.Load() }

func (r *Runner) pick(s *Script) (*redis.Script, bool) {
	if r.legacy.Load() {
		return s.legacy, true
	}
	return s.std, false
}

func add(c *atomic.Int64, n int64) {
	if c != nil {
		c.Add(n)
	}
}

// Run runs s once: EVALSHA, then EVAL if the server answers NOSCRIPT (after a restart, SCRIPT FLUSH
// or failover), and once more without the "#!lua" line if the server rejects it.
func (r *Runner) Run(ctx context.Context, rdb redis.Scripter, s *Script, keys []string, args ...any) (any, error) {
	for attempt := 0; ; attempt++ {
		sc, legacy := r.pick(s)
		add(r.Commands, 1)
		res, err := sc.EvalSha(ctx, rdb, keys, args...).Result()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			add(r.Loads, 1)
			add(r.Commands, 1)
			res, err = sc.Eval(ctx, rdb, keys, args...).Result()
		}
		if err != nil && attempt == 0 && !legacy && isShebangUnsupported(err) {
			r.legacy.Store(true)
			continue
		}
		return res, err
	}
}

// EvalSha queues an EVALSHA of s in a pipeline. A pipelined EVALSHA cannot fall back to EVAL
// (go-redis #3228): when its error satisfies [NeedsLoad], [Runner.Load] the script and send the
// call again.
func (r *Runner) EvalSha(ctx context.Context, pipe redis.Pipeliner, s *Script, keys []string, args ...any) *redis.Cmd {
	sc, _ := r.pick(s)
	add(r.Commands, 1)
	return sc.EvalSha(ctx, pipe, keys, args...)
}

// Load loads s into Redis (on every master of a Cluster), switching to the variant without the
// "#!lua" line if the server rejects it.
func (r *Runner) Load(ctx context.Context, rdb redis.Scripter, s *Script) error {
	add(r.Loads, 1)
	sc, legacy := r.pick(s)
	err := sc.Load(ctx, rdb).Err()
	if err != nil && !legacy && isShebangUnsupported(err) {
		r.legacy.Store(true)
		return s.legacy.Load(ctx, rdb).Err()
	}
	return err
}

// NeedsLoad reports whether a pipelined script call failed because the server does not have the
// script (NOSCRIPT) or rejects its "#!lua" line: [Runner.Load] it, then send the call again.
func NeedsLoad(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || isShebangUnsupported(err))
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

// ValidPrefix reports whether p can start a Redis key without disturbing the hash tag that follows
// it: it is 1 to limits.MaxKeyPrefixLen bytes and holds no brace or whitespace. Every WithKeyPrefix
// option checks its prefix with it.
func ValidPrefix(p string) bool {
	return p != "" && len(p) <= limits.MaxKeyPrefixLen && !strings.ContainsAny(p, "{} \t\r\n")
}

// Variant returns the go-redis script of one variant: without the "#!lua" line when legacy is true.
// A [Runner] picks the variant itself; this is for tests and tools that send a script by hand.
func (s *Script) Variant(legacy bool) *redis.Script {
	if legacy {
		return s.legacy
	}
	return s.std
}
