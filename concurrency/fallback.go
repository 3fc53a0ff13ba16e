package concurrency

import (
	"sync"
	"time"
)

// fallback is the local semaphore of the outcome.LocalFallback policy: per key, the leases this node granted
// while Redis could not decide, with their expiries on the local monotonic clock. It mirrors
// concurrency.lua: expired leases are dropped on every call, a key's entry goes when its last lease
// does.
type fallback struct {
	mu   sync.Mutex                      // guards keys
	keys map[string]map[uint64]time.Time // key -> lease number -> expiry
}

// purgeLocked drops key's expired leases and returns what is left (nil if nothing).
func (f *fallback) purgeLocked(key string, now time.Time) map[uint64]time.Time {
	ls := f.keys[key]
	for id, exp := range ls {
		if !exp.After(now) {
			delete(ls, id)
		}
	}
	if ls != nil && len(ls) == 0 {
		delete(f.keys, key)
		return nil
	}
	return ls
}

// acquire takes a lease for id if key holds fewer than capacity; it returns whether it did, the
// leases held after the call, and when denied the time until the earliest lease expires.
func (f *fallback) acquire(key string, id uint64, capacity int, ttl time.Duration, now time.Time) (bool, int, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ls := f.purgeLocked(key, now)
	if len(ls) >= capacity {
		var first time.Time
		for _, exp := range ls {
			if first.IsZero() || exp.Before(first) {
				first = exp
			}
		}
		return false, len(ls), first.Sub(now)
	}
	if ls == nil {
		if f.keys == nil {
			f.keys = make(map[string]map[uint64]time.Time)
		}
		ls = make(map[uint64]time.Time, 1)
		f.keys[key] = ls
	}
	ls[id] = now.Add(ttl)
	return true, len(ls), 0
}

// release removes id's lease; it reports whether it was held.
func (f *fallback) release(key string, id uint64, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ls := f.purgeLocked(key, now)
	if _, ok := ls[id]; !ok {
		return false
	}
	delete(ls, id)
	if len(ls) == 0 {
		delete(f.keys, key)
	}
	return true
}

// extend sets id's expiry to now+ttl if it is still held; it reports whether it was.
func (f *fallback) extend(key string, id uint64, ttl time.Duration, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ls := f.purgeLocked(key, now)
	if _, ok := ls[id]; !ok {
		return false
	}
	ls[id] = now.Add(ttl)
	return true
}

// count returns the unexpired leases of key.
func (f *fallback) count(key string, now time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.purgeLocked(key, now))
}

// share is this node's fallback capacity for limit: max(1, limit/nodes).
func share(limit, nodes int) int { return max(1, limit/nodes) }
