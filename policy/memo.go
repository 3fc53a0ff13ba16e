package policy

import (
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/hybridrate/hybridrate/outcome"
)

// memo remembers denials until their retry-after, so that a request a counter is known to deny is
// denied before any other counter consumes anything. It is bounded (least recently used entries go
// first) and safe for concurrent use.
//
// It is not a copy of hybrid's deny cache: hybrid remembers a key's denial for that key alone, when
// the request reaches it, while the memo is consulted for every enforced counter of a request (strict
// ones too) before the first counter consumes, which is what keeps a denied request from consuming
// the broader rules' tokens on every retry (see "Hierarchy" in the package documentation).
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

// remember records a denial in the memo until its retry-after.
func (e *Enforcer) remember(p *planned, gen uint64, wait time.Duration) {
	if e.memo == nil || wait <= 0 {
		return
	}
	e.memo.add(p.key, gen, p.n, e.now().Add(wait))
}

// checkMemo denies the request, before any counter is consulted or consumes anything, when the memo
// remembers that one of its enforced counters denied the same subject at this cost or less.
func (e *Enforcer) checkMemo(c *compiled, enforced []planned, res *Result) {
	if e.memo == nil || e.memo.empty() {
		return
	}
	now := e.now()
	for i := range enforced {
		p := &enforced[i]
		if wait, ok := e.memo.denied(p.key, c.gen, p.n, now); ok {
			e.stats.Memo.Add(1)
			d := p.decision(false, outcome.SourceMemo)
			d.RetryAfter = wait
			d.ResetAfter = wait
			res.Decisions = append(res.Decisions, d)
			res.Allowed, res.Rule, res.RetryAfter = false, p.r.id, wait
			return
		}
	}
}
