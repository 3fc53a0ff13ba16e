package policy

import (
	"math"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
)

// memo remembers denials until their retry-after, so that a request a counter is known to deny is
// denied before any other counter consumes anything. It is bounded (least recently used entries go
// first) and safe for concurrent use.
type memo struct {
	c *lru.Cache[string, memoEntry]
	n atomic.Int64 // the cache's length after the last change: a hint that lets Check skip the lock
}

type memoEntry struct {
	gen   uint64    // the policy generation that denied; other generations ignore the entry
	n     int64     // the cost that was denied; cheaper requests are not denied by this entry
	until time.Time // when the denial expires
}

func newMemo(size int) *memo {
	c, _ := lru.New[string, memoEntry](size) // size > 0, checked by the caller
	return &memo{c: c}
}

func (m *memo) empty() bool { return m.n.Load() == 0 }

// denied reports whether key is remembered as denied for a cost of n under generation gen at now,
// and for how much longer.
func (m *memo) denied(key string, gen uint64, n int64, now time.Time) (time.Duration, bool) {
	e, ok := m.c.Get(key)
	if !ok {
		return 0, false
	}
	wait := e.until.Sub(now)
	if e.gen != gen || wait <= 0 {
		m.c.Remove(key)
		m.n.Store(int64(m.c.Len()))
		return 0, false
	}
	if n < e.n {
		return 0, false
	}
	return wait, true
}

func (m *memo) add(key string, gen uint64, n int64, until time.Time) {
	m.c.Add(key, memoEntry{gen: gen, n: n, until: until})
	m.n.Store(int64(m.c.Len()))
}

// fallbacks holds the local limiters of strict rules under LocalFallback while Redis is away.
type fallbacks struct {
	c *lru.Cache[string, *rate.Limiter]
}

func newFallbacks(size int) *fallbacks {
	c, _ := lru.New[string, *rate.Limiter](size)
	return &fallbacks{c: c}
}

// reserve takes n tokens for key from a local limiter enforcing the unit's limit divided by nodes. It
// returns whether they were available, how long until they would be, and a function that puts them
// back (nil when nothing was taken).
func (f *fallbacks) reserve(key string, u *unit, n int64, nodes int, now time.Time) (bool, time.Duration, func()) {
	r := rate.Limit(float64(u.limit) / u.window.Seconds() / float64(nodes))
	b := int(max(u.limit/int64(nodes), n, 1))
	l, ok := f.c.Get(key)
	if !ok {
		l = rate.NewLimiter(r, b)
		if prev, found, _ := f.c.PeekOrAdd(key, l); found {
			l = prev
		}
	}
	if l.Limit() != r || l.Burst() != b {
		l.SetLimitAt(now, r)
		l.SetBurstAt(now, b)
	}
	res := l.ReserveN(now, int(min(n, math.MaxInt32)))
	if !res.OK() {
		return false, time.Duration(math.MaxInt64), nil
	}
	if wait := res.DelayFrom(now); wait > 0 {
		res.CancelAt(now)
		return false, wait, nil
	}
	return true, 0, func() { res.CancelAt(now) }
}
