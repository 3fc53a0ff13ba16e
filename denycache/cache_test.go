package denycache

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func newCache(t *testing.T, n int) *Cache {
	t.Helper()
	c, err := New(Config{MaxBans: n, MaxDenied: n})
	require.NoError(t, err)
	return c
}

func TestNewValidates(t *testing.T) {
	_, err := New(Config{MaxBans: 0, MaxDenied: 1})
	assert.Error(t, err)
}

func TestScenario(t *testing.T) {
	c := newCache(t, 10)
	assert.True(t, c.Empty())
	c.Deny("a", t0.Add(time.Second))
	c.Ban("b", t0.Add(time.Minute))
	assert.False(t, c.Empty())
	for i, st := range []struct {
		key   string
		at    time.Duration
		want  Reason
		until time.Duration
	}{
		{"a", 0, Denied, time.Second},
		{"a", 999 * time.Millisecond, Denied, time.Second},
		{"a", time.Second, None, 0}, // the deadline itself is free
		{"a", 0, None, 0},           // and the expired entry was removed
		{"b", 59 * time.Second, Banned, time.Minute},
		{"c", 0, None, 0},
	} {
		got, until := c.Check(st.key, t0.Add(st.at))
		assert.Equal(t, st.want, got, "step %d", i)
		if st.want != None {
			assert.Equal(t, t0.Add(st.until), until, "step %d", i)
		}
	}
	c.Unban("b")
	assert.True(t, c.Empty())
}

func TestBoundedAndCountsStayExact(t *testing.T) {
	c := newCache(t, 8)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				k := strconv.Itoa((g + i) % 50)
				c.Deny(k, t0.Add(time.Hour))
				c.Check(k, t0)
				if i%7 == 0 {
					c.Forget(k)
				}
			}
		}()
	}
	wg.Wait()
	_, denied := c.Len()
	assert.LessOrEqual(t, denied, 8)
	assert.Equal(t, int64(denied), c.nDeny.Load(), "the empty-check count matches the cache")
}

func TestReplaceBans(t *testing.T) {
	c := newCache(t, 8)
	c.Ban("old", t0.Add(time.Hour))
	c.ReplaceBans(map[string]time.Time{"new": t0.Add(time.Hour)})
	r, _ := c.Check("old", t0)
	assert.Equal(t, None, r)
	r, _ = c.Check("new", t0)
	assert.Equal(t, Banned, r)
}

func BenchmarkCheckEmpty(b *testing.B) {
	c, _ := New(Config{MaxBans: 8, MaxDenied: 8})
	b.ReportAllocs()
	for b.Loop() {
		if !c.Empty() {
			b.Fatal("not empty")
		}
	}
}
