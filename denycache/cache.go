// Package denycache holds the keys a limiter denies without any work: banned keys, and keys Redis
// denied until a known time ("denied until retry-after"). Both are bounded LRU caches of deadlines
// (golang-lru/v2 lru.Cache; no goroutines, no clock of its own: callers pass now).
//
// Checking an empty cache costs one atomic load, so the hot path pays almost nothing when nobody is
// banned or denied. The package is a building block of package hybrid and may move under internal/.
package denycache

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// Reason says why a key is denied.
type Reason int

// The reasons a key is denied.
const (
	None   Reason = iota // not denied
	Banned               // banned by an operator (Ban)
	Denied               // Redis denied it recently; denied until its retry-after
)

// Config configures a [Cache].
type Config struct {
	// MaxBans and MaxDenied bound the two sets; each at least 1. The least recently added or
	// checked entry goes first.
	MaxBans   int
	MaxDenied int
}

// Cache is a bounded set of deadlines per key. Safe for concurrent use; create it with [New].
type Cache struct {
	bans   *lru.Cache[string, time.Time]
	denied *lru.Cache[string, time.Time]
	mu     sync.Mutex   // serialises writes so that the counts below match the caches
	nBans  atomic.Int64 // entries in bans, refreshed after each write
	nDeny  atomic.Int64 // entries in denied, refreshed after each write
}

// New returns an empty cache.
func New(cfg Config) (*Cache, error) {
	if cfg.MaxBans < 1 || cfg.MaxDenied < 1 {
		return nil, errors.New("denycache: MaxBans and MaxDenied must be at least 1")
	}
	c := &Cache{}
	var err error
	if c.bans, err = lru.New[string, time.Time](cfg.MaxBans); err != nil {
		return nil, err
	}
	if c.denied, err = lru.New[string, time.Time](cfg.MaxDenied); err != nil {
		return nil, err
	}
	return c, nil
}

// Empty reports whether nothing is banned or denied; one atomic load each.
func (c *Cache) Empty() bool { return c.nBans.Load() == 0 && c.nDeny.Load() == 0 }

// write runs fn with the write lock held and refreshes the counts.
func (c *Cache) write(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fn()
	c.nBans.Store(int64(c.bans.Len()))
	c.nDeny.Store(int64(c.denied.Len()))
}

// Check reports whether key is denied at now, why, and until when. Expired entries are removed.
func (c *Cache) Check(key string, now time.Time) (Reason, time.Time) {
	if c.nBans.Load() > 0 {
		if until, ok := c.bans.Get(key); ok {
			if now.Before(until) {
				return Banned, until
			}
			c.write(func() {
				if u, ok := c.bans.Peek(key); ok && !now.Before(u) {
					c.bans.Remove(key)
				}
			})
		}
	}
	if c.nDeny.Load() > 0 {
		if until, ok := c.denied.Get(key); ok {
			if now.Before(until) {
				return Denied, until
			}
			c.write(func() {
				if u, ok := c.denied.Peek(key); ok && !now.Before(u) {
					c.denied.Remove(key)
				}
			})
		}
	}
	return None, time.Time{}
}

// Ban denies key until until.
func (c *Cache) Ban(key string, until time.Time) { c.write(func() { c.bans.Add(key, until) }) }

// Unban lifts a ban.
func (c *Cache) Unban(key string) { c.write(func() { c.bans.Remove(key) }) }

// ReplaceBans makes the ban set exactly bans (key → deadline).
func (c *Cache) ReplaceBans(bans map[string]time.Time) {
	c.write(func() {
		for _, k := range c.bans.Keys() {
			if _, ok := bans[k]; !ok {
				c.bans.Remove(k)
			}
		}
		for k, until := range bans {
			c.bans.Add(k, until)
		}
	})
}

// Deny denies key until until (a Redis retry-after).
func (c *Cache) Deny(key string, until time.Time) { c.write(func() { c.denied.Add(key, until) }) }

// Forget removes a cached denial.
func (c *Cache) Forget(key string) { c.write(func() { c.denied.Remove(key) }) }

// Len returns the number of bans and of cached denials.
func (c *Cache) Len() (bans, denied int) { return c.bans.Len(), c.denied.Len() }
