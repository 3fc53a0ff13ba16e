package local

import (
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// A split is a contended key's allowance divided among padded slots, so that two cores taking
// from the same key write different cache lines. An entry is split when takes on it lose CASes on
// its word (Store.contended: splitAfter lost CASes within one window of 256 decisions or one
// Collect); it stays split for its life.
//
// # Accounting
//
// A slot holds tokens moved out of the entry's allowance and not yet admitted. Moving them
// (Store.refill, under the entry's lock) adds them to total in the entry's word first, where the
// mark bounds them, then to the slot; a take from a slot subtracts from the slot only. So at every
// instant
//
//	consumed = total in the word − Σ tokens in the slots
//
// and total never exceeds the mark: no more than the mark is ever admitted, over all slots.
// Whatever reads the consumption to act on it brings the slots' tokens back into the word first
// (drainLocked, under the entry's lock, where no refill runs): Next before it reports to Redis
// (so Redis counts exactly what was admitted), Grant before it applies a new mark, Expire before
// it writes the lease off, Refund, eviction (tryEvict), and TryTake when the word alone cannot
// cover a take. Lock-free readers (Pending, Unused, Unreported, clean) subtract the
// slots' tokens as they read them (total), which may count a token being moved or drained as
// consumed for an instant, never the reverse; Total takes the lock.
//
// A take from a slot counts its decision in the slot's word, as Store.Take counts one in the
// entry's (see takeShift), and Store.fold folds the slots' counts with the entry's.
type split struct {
	slots []slot        // a power of two of them, each on its own cache line
	salt  atomic.Uint64 // mixed into slotHint: a new one sends the goroutines to other slots
	lost  atomic.Uint32 // CASes lost on slots; every reshuffleAfter-th draws a new salt
}

// slot is one cache line of a split: its word holds, as an entry's does, tokens in its low
// takeShift bits (here: tokens moved to the slot and not admitted) and decisions not yet folded
// into Stats.Taken above them.
type slot struct {
	word atomic.Int64
	_    [64 - 8]byte
}

// splitAfter is the number of CASes lost on an entry's word, within one window, that splits it:
// the lost-CAS count in the flags word (lostMask: at most 7) reaches splitAfter−1, and the loss
// after that splits.
const splitAfter = 8

// maxChunk bounds the tokens one refill moves to a slot (beyond the take it serves).
const maxChunk = 1 << 16

// newSplit returns a split of 4·GOMAXPROCS slots, rounded up to a power of two, at least 8 and at
// most 64: goroutines pick slots by their stack's address (slotHint), so more slots than cores
// make two busy goroutines meet on one rarely.
func newSplit() *split {
	n := 8
	for n < 4*runtime.GOMAXPROCS(0) && n < 64 {
		n *= 2
	}
	return &split{slots: make([]slot, n)}
}

// splitOf returns e's split, or nil when e is not split.
func (e *Entry) splitOf() *split {
	if e.flags.v.Load()&fSplit == 0 {
		return nil
	}
	return e.rare.Load().split.Load()
}

// Split reports whether e's allowance is split per core: takes on e lost many CASes to one another
// (8 within 256 decisions or one [Store.Collect]), so [Store.Take] now takes from one of several
// padded slots, each holding tokens moved out of e's allowance, and two cores taking from e write
// different cache lines. It changes nothing else a caller sees: all slots together never admit
// more than the mark, and Total, Remaining, Unused, the counts a [Call] sends, Expire's write-off
// and Stats.Taken count what was admitted, not what a slot holds. A split lasts for the entry's
// life; [Stats].Splits counts them.
func (e *Entry) Split() bool { return e.flags.has(fSplit) }

// doSplit splits e's allowance, unless it already is, and reports whether it did.
func (e *Entry) doSplit() bool {
	defer e.acquire().Unlock()
	if e.flags.has(fSplit) {
		return false
	}
	e.more().split.Store(newSplit())
	e.flags.set(fSplit) // after the pointer: whoever sees the flag finds the split
	return true
}

// total returns the tokens consumed: total in e's word, less the tokens e's slots hold. Lock-free;
// the slots are read before the word, so that a refill (word first, then a slot) is never counted
// as admitted tokens missing, and a drain (slot first, then the word) at worst counts the tokens
// it moves as consumed for an instant.
func (e *Entry) total() int64 {
	sp := e.splitOf()
	if sp == nil {
		return tot(e.word.Load())
	}
	held := int64(0)
	for i := range sp.slots {
		held += tot(sp.slots[i].word.Load())
	}
	return max(tot(e.word.Load())-held, 0)
}

// drainLocked moves the tokens e's slots hold back to its word, keeping the slots' decision
// counts; afterwards total in the word is the tokens consumed, exactly, until the next refill. e's
// lock must be held (so that no refill runs).
func (e *Entry) drainLocked() {
	sp := e.splitOf()
	if sp == nil {
		return
	}
	for i := range sp.slots {
		w := &sp.slots[i].word
		for {
			v := w.Load()
			k := tot(v)
			if k == 0 {
				break
			}
			if w.CompareAndSwap(v, v-k) {
				e.word.Add(-k)
				break
			}
		}
	}
}

// slotHint returns a number that stays the same for the calling goroutine while its stack does not
// move: the address of a variable in its frame, mixed. Goroutines' stacks are at least 2 KB apart,
// so two goroutines get unrelated numbers; it costs a multiply, where math/rand/v2's generator
// costs a call and gives a goroutine no slot of its own (a random slot was last written by the
// other core half the time, on two cores).
func slotHint() uint64 {
	var b byte
	return uint64(uintptr(unsafe.Pointer(&b)) >> 11)
}

// reshuffleAfter is the number of CASes lost on a split's slots that draws it a new salt: two
// goroutines whose hints meet on one slot keep losing CASes there, until a salt parts them.
const reshuffleAfter = 16

// contended counts a CAS lost on e's word by a take, and splits e when it is the splitAfter-th of
// the window (see split).
//
//go:noinline
func (s *Store) contended(e *Entry) {
	for {
		f := e.flags.v.Load()
		if f&fSplit != 0 {
			return
		}
		if f&lostMask == (splitAfter-1)<<lostShift {
			s.Split(e)
			e.flags.v.And(^uint32(lostMask))
			return
		}
		if e.flags.v.CompareAndSwap(f, f+lostOne) {
			return
		}
	}
}

// takeSplit is Store.Take for a split entry: n tokens from the calling goroutine's slot (another
// slot when that one's CAS is lost), or a refill of the slot from the entry's allowance. It returns
// e when it took the tokens, nil otherwise (taking and counting nothing).
//
//go:noinline
func (s *Store) takeSplit(e *Entry, n int64) *Entry {
	sp := e.rare.Load().split.Load()
	mask := uint64(len(sp.slots) - 1)
	i := ((slotHint() ^ sp.salt.Load()) * 0x9e3779b97f4a7c15) >> 58 // the product's top bits, the well-mixed ones
	for range len(sp.slots) {
		sl := &sp.slots[i&mask]
		w := sl.word.Load()
		if tot(w) < n {
			return s.refill(e, sp, sl, n)
		}
		if sl.word.CompareAndSwap(w, w-n+oneTake) {
			w += oneTake - n
			if f := e.flags.v.Load(); f&(fEvicted|fUsed|fDirty) != fUsed|fDirty || uint64(w) < oneTake {
				return s.afterSlot(e, sl, f, w, n)
			}
			return e
		}
		if sp.lost.Add(1)%reshuffleAfter == 0 {
			sp.salt.Store(rand.Uint64())
		}
		i++ // another goroutine on this slot: the next one
	}
	return s.refill(e, sp, &sp.slots[i&mask], n)
}

// refill serves a take of n tokens that slot sl could not cover, under e's lock: from sl if a
// concurrent refill filled it, else by moving a chunk of the entry's allowance (a share of what is
// left, at least n) to sl and taking n of it, else, when the allowance left in the word cannot
// cover n, by draining every slot back to the word and taking n from it, so that a take is denied
// only when the entry's whole allowance cannot cover it. It returns e or nil as Take does.
func (s *Store) refill(e *Entry, sp *split, sl *slot, n int64) *Entry {
	mu := e.acquire()
	for {
		w := sl.word.Load()
		if tot(w) < n {
			break
		}
		if sl.word.CompareAndSwap(w, w-n+oneTake) {
			mu.Unlock()
			return s.afterSlot(e, sl, e.flags.v.Load(), w-n+oneTake, n)
		}
	}
	for {
		w := e.word.Load()
		free := e.mark.Load() - tot(w)
		if free < n {
			break
		}
		c := min(max(free/int64(2*len(sp.slots)), n), free, maxChunk+n)
		if !e.word.CompareAndSwap(w, w+c) {
			continue // a take on the word itself (one that read the flags before the split) or a fold
		}
		v := sl.word.Add(c - n + oneTake) // the chunk's rest, and this take's decision
		mu.Unlock()
		return s.afterSlot(e, sl, e.flags.v.Load(), v, n)
	}
	e.drainLocked()
	for {
		w := e.word.Load()
		if tot(w)+n > e.mark.Load() {
			mu.Unlock()
			return nil
		}
		if e.word.CompareAndSwap(w, w+n+oneTake) {
			mu.Unlock()
			w += n + oneTake
			return s.afterTake(e, e.flags.v.Load(), w, n)
		}
	}
}

// afterSlot is afterTake for a take of n tokens from slot sl of e, which left the slot's word w,
// with the flags f read after it: the count's wrap, the handshake with an eviction (the tokens go
// back to the slot, where they are still part of total), the CLOCK bit and the dirty list. It
// returns e, or nil when e was evicted.
func (s *Store) afterSlot(e *Entry, sl *slot, f uint32, w, n int64) *Entry {
	if uint64(w) < oneTake {
		s.stats.Taken.Add(takeWrap)
	}
	if f&fEvicted != 0 {
		s.untakeWord(&sl.word, n) // the tokens go back to the slot
		return nil
	}
	e.noteUse(f)
	return e
}

// foldWord moves the decisions counted in w (an entry's or a slot's word) to Stats.Taken.
func (s *Store) foldWord(w *atomic.Int64) {
	for {
		v := w.Load()
		k := takes(v)
		if k == 0 {
			return
		}
		if w.CompareAndSwap(v, tot(v)) {
			s.stats.Taken.Add(k)
			return
		}
	}
}

// Split splits e's allowance per core now, as contention on it would (see [Entry.Split]), and
// reports whether it did (false when e already was). For a caller that knows a key is hot before
// its takes collide, and for tests.
func (s *Store) Split(e *Entry) bool {
	if !e.doSplit() {
		return false
	}
	s.stats.Splits.Add(1)
	return true
}
