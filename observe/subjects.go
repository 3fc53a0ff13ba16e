package observe

import "sync"

// MaxRevealSubjects bounds WithRevealSubjects.
const MaxRevealSubjects = 1 << 20

// subjects maps hashed keys to readable subjects, keeping the newest max entries (first in, first
// out). It is safe for concurrent use.
type subjects struct {
	mu   sync.RWMutex
	m    map[string]string // guarded by mu
	ring []string          // guarded by mu: the keys in insertion order, from next on when full
	next int               // guarded by mu
	max  int
}

func newSubjects(max int) *subjects {
	return &subjects{m: make(map[string]string, min(max, 1024)), ring: make([]string, 0, min(max, 1024)), max: max}
}

// add records key's readable subject, made by subject only when key is new.
func (s *subjects) add(key string, subject func() string) {
	s.mu.RLock()
	_, ok := s.m[key]
	s.mu.RUnlock()
	if ok {
		return
	}
	v := subject()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[key]; ok {
		return
	}
	if len(s.ring) < s.max {
		s.ring = append(s.ring, key)
	} else {
		delete(s.m, s.ring[s.next])
		s.ring[s.next] = key
		s.next = (s.next + 1) % len(s.ring)
	}
	s.m[key] = v
}

// get returns key's readable subject; s may be nil.
func (s *subjects) get(key string) (string, bool) {
	if s == nil {
		return "", false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.m[key]
	return v, ok
}

// annotate fills in the Subject of the keys it knows; s may be nil.
func (s *subjects) annotate(keys []KeyCount) {
	if s == nil {
		return
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i := range keys {
		if v, ok := s.m[keys[i].Key]; ok {
			keys[i].Subject = v
		}
	}
}
