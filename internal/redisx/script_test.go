package redisx

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/redistest"
)

var incr = NewScript("#!lua\nreturn redis.call('INCR', KEYS[1])")

func TestRunnerRecoversFromNoScript(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, real bool) {
		ctx := context.Background()
		var commands, loads atomic.Int64
		r := Runner{Commands: &commands, Loads: &loads}
		for i := int64(1); i <= 3; i++ {
			require.NoError(t, rdb.ScriptFlush(ctx).Err())
			res, err := r.Run(ctx, rdb, incr, []string{"k"})
			require.NoError(t, err, "after SCRIPT FLUSH %d", i)
			assert.Equal(t, i, res)
		}
		assert.Equal(t, !real, r.Legacy(), "Redis 7 runs the script with its #!lua line; miniredis cannot")
		if real {
			assert.Equal(t, int64(6), commands.Load(), "EVALSHA, then EVAL, per call")
			assert.Equal(t, int64(3), loads.Load())
		}
		res, err := r.Run(ctx, rdb, incr, []string{"k"})
		require.NoError(t, err)
		assert.Equal(t, int64(4), res, "loaded now: one EVALSHA")
	})
}

func TestRunnerPipelineReloads(t *testing.T) {
	redistest.ForEachBackend(t, func(t *testing.T, rdb redis.UniversalClient, real bool) {
		ctx := context.Background()
		var r Runner
		send := func() (*redis.Cmd, error) {
			pipe := rdb.Pipeline()
			cmd := r.EvalSha(ctx, pipe, incr, []string{"p"})
			_, err := pipe.Exec(ctx)
			return cmd, err
		}
		cmd, err := send()
		require.Error(t, err, "a pipelined EVALSHA cannot fall back to EVAL")
		assert.True(t, NeedsLoad(cmd.Err()), "%v", cmd.Err())
		require.NoError(t, r.Load(ctx, rdb, incr))
		cmd, err = send()
		require.NoError(t, err)
		assert.Equal(t, int64(1), cmd.Val())
		assert.Equal(t, !real, r.Legacy())
		assert.False(t, NeedsLoad(nil))
		assert.False(t, NeedsLoad(replyErr("WRONGTYPE Operation against a key holding the wrong kind of value")))
	})
}

func TestScriptVariants(t *testing.T) {
	t.Parallel()
	assert.Equal(t, redis.NewScript("#!lua\nreturn redis.call('INCR', KEYS[1])").Hash(), incr.Variant(false).Hash())
	assert.Equal(t, redis.NewScript("return redis.call('INCR', KEYS[1])").Hash(), incr.Variant(true).Hash())
}

func TestBreakerConfigValidate(t *testing.T) {
	t.Parallel()
	assert.NoError(t, BreakerConfig{Threshold: 1, Cooldown: time.Millisecond}.Validate())
	for _, c := range []BreakerConfig{
		{Threshold: 0, Cooldown: time.Second}, {Threshold: 1}, {Threshold: 1, Cooldown: time.Second, MinSpan: -1},
	} {
		assert.Error(t, c.Validate(), "%+v", c)
	}
}

func TestValidPrefix(t *testing.T) {
	t.Parallel()
	assert.True(t, ValidPrefix("hr"))
	assert.True(t, ValidPrefix("a:b"))
	for _, p := range []string{"", "a{", "b}", "c d", "e\tf", "g\n"} {
		assert.False(t, ValidPrefix(p), "%q", p)
	}
}
