package workload

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParsePattern(t *testing.T) {
	t.Parallel()
	for _, p := range []Pattern{Uniform, Zipf, Hot, Churn} {
		got, err := ParsePattern(p.String())
		require.NoError(t, err)
		assert.Equal(t, p, got)
	}
	_, err := ParsePattern("gaussian")
	assert.ErrorContains(t, err, "uniform, zipf, hot or churn")
}

func TestPickerIsDeterministic(t *testing.T) {
	t.Parallel()
	a, err := NewPicker(Zipf, 1000, 1.1, 7, 3)
	require.NoError(t, err)
	b, err := NewPicker(Zipf, 1000, 1.1, 7, 3)
	require.NoError(t, err)
	c, err := NewPicker(Zipf, 1000, 1.1, 7, 4)
	require.NoError(t, err)
	same, diff := true, false
	for range 1000 {
		x, y, z := a.Next(), b.Next(), c.Next()
		same = same && x == y
		diff = diff || x != z
	}
	assert.True(t, same, "same seed and stream, same keys")
	assert.True(t, diff, "another stream, other keys")
}

func TestPickerDistributions(t *testing.T) {
	t.Parallel()
	const keys, n = 100, 200_000
	count := func(p Pattern) []int {
		pk, err := NewPicker(p, keys, 1.2, 1, 0)
		require.NoError(t, err)
		c := make([]int, keys)
		for range n {
			k := pk.Next()
			require.True(t, k >= 0 && k < keys, "key %d out of range", k)
			c[k]++
		}
		return c
	}
	t.Run("uniform spreads evenly", func(t *testing.T) {
		t.Parallel()
		for k, c := range count(Uniform) {
			assert.InDelta(t, n/keys, c, n/keys*0.15, "key %d", k)
		}
	})
	t.Run("zipf makes key 0 the hottest, by far", func(t *testing.T) {
		t.Parallel()
		c := count(Zipf)
		for k := 1; k < keys; k++ {
			assert.Greater(t, c[0], c[k])
		}
		assert.Greater(t, c[0], 10*c[keys-1])
	})
	t.Run("hot always picks key 0", func(t *testing.T) {
		t.Parallel()
		assert.Equal(t, n, count(Hot)[0])
	})
}

func TestNewPickerRejects(t *testing.T) {
	t.Parallel()
	_, err := NewPicker(Uniform, 0, 0, 1, 0)
	assert.Error(t, err)
	_, err = NewPicker(Zipf, 10, 1, 1, 0)
	assert.Error(t, err, "s must be above 1")
	_, err = NewPicker(Pattern(9), 10, 0, 1, 0)
	assert.Error(t, err)
}

func TestPacer(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	t.Run("spaces requests at the rate", func(t *testing.T) {
		t.Parallel()
		p := NewPacer(1000) // one per ms
		steps := []struct {
			now  time.Duration
			wait time.Duration
		}{
			{0, 0},                // slot 0
			{0, ms + 1},           // slot 1 is due at 1ms
			{ms, 0},               // slot 1
			{ms + ms/2, ms/2 + 1}, // slot 2 at 2ms
			{5 * ms, 0},           // behind: slots 2, 3, 4, 5 go at once
			{5 * ms, 0},
			{5 * ms, 0},
			{5 * ms, 0},
			{5 * ms, ms + 1},
		}
		for i, s := range steps {
			if got := p.Next(s.now); got != s.wait {
				t.Errorf("step %d: Next(%v) = %v, want %v", i, s.now, got, s.wait)
			}
		}
		assert.Zero(t, p.Skipped())
	})
	t.Run("skips backlog beyond MaxLag", func(t *testing.T) {
		t.Parallel()
		p := NewPacer(1000)
		require.Zero(t, p.Next(0))
		// 100ms late: 20ms of backlog is kept (about 21 requests), the rest skipped.
		sent := 0
		for p.Next(100*ms) == 0 {
			sent++
		}
		assert.InDelta(t, 21, sent, 1)
		assert.InDelta(t, 79, p.Skipped(), 1)
	})
	t.Run("rate 0 never waits", func(t *testing.T) {
		t.Parallel()
		p := NewPacer(0)
		for i := range 100 {
			require.Zero(t, p.Next(time.Duration(i)))
		}
	})
}

func TestRouter(t *testing.T) {
	t.Parallel()
	const nodes, keys, perKey = 8, 200, 2000

	t.Run("the affinity share goes home, the rest evenly to the other nodes", func(t *testing.T) {
		t.Parallel()
		for _, f := range []float64{0, 0.5, 0.9, 1} {
			r, err := NewRouter(nodes, f, 1, 0)
			require.NoError(t, err)
			var home, total int
			others := make([]int, nodes) // requests to non-home nodes, by node
			for k := range keys {
				h := Home(k, nodes)
				for range perKey {
					n := r.Node(k)
					require.True(t, n >= 0 && n < nodes, "node %d out of range", n)
					total++
					if n == h {
						home++
					} else {
						others[n]++
					}
				}
			}
			// 400,000 draws: the share's standard deviation is under 0.08%.
			assert.InDelta(t, f, float64(home)/float64(total), 0.005, "affinity %v: share sent home", f)
			away := float64(total - home)
			for n, c := range others {
				if away > 0 {
					assert.InDelta(t, 1.0/nodes, float64(c)/away, 0.01, "affinity %v: node %d's share of the rest", f, n)
				}
			}
		}
	})
	t.Run("homes spread the keys over the nodes", func(t *testing.T) {
		t.Parallel()
		c := make([]int, nodes)
		for k := range 80_000 {
			c[Home(k, nodes)]++
		}
		for n, v := range c {
			assert.InDelta(t, 10_000, v, 500, "node %d", n)
		}
	})
	t.Run("one node takes everything", func(t *testing.T) {
		t.Parallel()
		r, err := NewRouter(1, 0, 1, 0)
		require.NoError(t, err)
		for k := range 100 {
			require.Zero(t, r.Node(k))
		}
	})
	t.Run("the same seed and stream route alike", func(t *testing.T) {
		t.Parallel()
		a, _ := NewRouter(nodes, 0.7, 3, 5)
		b, _ := NewRouter(nodes, 0.7, 3, 5)
		for k := range 1000 {
			require.Equal(t, a.Node(k), b.Node(k))
		}
	})
	t.Run("bad arguments", func(t *testing.T) {
		t.Parallel()
		for _, f := range []float64{-0.1, 1.1, math.NaN()} {
			_, err := NewRouter(nodes, f, 1, 0)
			assert.Error(t, err, "affinity %v", f)
		}
		_, err := NewRouter(0, 0.5, 1, 0)
		assert.Error(t, err)
	})
}

func TestChurnPicker(t *testing.T) {
	t.Parallel()
	const keys, workers, perWorker = 1_000_000, 4, 30_000
	seen := map[int]int{}
	hot := 0
	for w := range workers {
		pk, err := NewChurnPicker(keys, 1, uint64(w), workers)
		require.NoError(t, err)
		for range perWorker {
			k := pk.Next()
			require.True(t, k >= 0 && k < keys, "key %d out of range", k)
			if k < ChurnHotKeys {
				hot++
				continue
			}
			seen[k]++
		}
	}
	total := workers * perWorker
	assert.InDelta(t, ChurnHotShare, float64(hot)/float64(total), 0.01, "hot share")
	once := 0
	for k, n := range seen {
		require.True(t, n == 1 || n == 2, "cold key %d seen %d times", k, n)
		if n == 1 {
			once++
		}
	}
	assert.InDelta(t, 0.5, float64(once)/float64(len(seen)), 0.02, "half the cold keys seen once, half twice")
	assert.InDelta(t, float64(total-hot)/1.5, float64(len(seen)), float64(total)/100, "1.5 requests per new key")

	t.Run("starts over when the key space is walked", func(t *testing.T) {
		t.Parallel()
		pk, err := NewChurnPicker(ChurnHotKeys+10, 1, 0, 1)
		require.NoError(t, err)
		for range 1000 {
			k := pk.Next()
			require.True(t, k >= 0 && k < ChurnHotKeys+10)
		}
	})
	t.Run("bad arguments", func(t *testing.T) {
		t.Parallel()
		_, err := NewChurnPicker(ChurnHotKeys, 1, 0, 1)
		assert.Error(t, err, "no cold keys")
		_, err = NewChurnPicker(100, 1, 2, 2)
		assert.Error(t, err, "stream out of range")
		_, err = NewPicker(Churn, 100, 0, 1, 0)
		assert.Error(t, err, "churn needs the stream count")
	})
}
