package local

import (
	"encoding/binary"
	"errors"
	"hash/maphash"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"unsafe"
)

const (
	shardBits = 6
	numShards = 1 << shardBits
	minTable  = groupSlots // a table's smallest capacity: one group
)

// Config configures a [Store].
type Config struct {
	// MaxKeys caps the number of keys the store tracks, at least 64. When a shard is full, a clean key
	// (nothing pending) is evicted, oldest-used first by the CLOCK algorithm; a key with pending
	// consumption is never evicted.
	MaxKeys int

	// Held, when set, reports whether a key's entry must be held ([Store.Hold]): Insert creates the
	// entry of such a key held, before any reader can see it, and [Store.Release] leaves such a
	// key's entry held. It is called under a shard's lock, so it must not call into the store.
	Held func(key string) bool
}

// Stats counts what the store did. All fields but Taken only grow.
type Stats struct {
	Inserts   atomic.Int64 // keys added
	Evictions atomic.Int64 // clean keys evicted to make room
	Full      atomic.Int64 // inserts refused because every candidate had pending consumption
	Splits    atomic.Int64 // entries whose allowance was split per core (see Entry.Split)

	// Taken counts the decisions [Store.Take] admitted. It is not raised by each decision (that
	// would be a locked instruction per decision): each entry counts its own in the word Take
	// already writes (a split entry in the word of the slot it took from: see [Entry.Split]), and
	// Taken gets them when [Store.Collect] takes the entry off its dirty list (a decision puts it
	// there), when the entry leaves the store ([Store.Remove], an eviction, [Store.Sweep]), and
	// every 256th decision of an entry (or of a slot). So Taken lags the decisions by those
	// made since their entries were last collected (for a caller that collects every interval, at
	// most an interval's), and never loses one: after a Collect with no decision running, it is
	// exact. A take undone by a concurrent eviction after its entry was collected is taken off
	// Taken again: the only case where Taken steps back, by one per such take.
	Taken atomic.Int64
}

// Store holds the per-key local state of one limiter. It is safe for concurrent use. Lookups are
// lock-free; inserts and evictions take a per-shard mutex. The zero Store is not usable; call [New].
type Store struct {
	seed     maphash.Seed // for keys longer than 32 bytes
	k0, k1   uint64       // Hash's seeds for keys of up to 32 bytes, random
	perShard int          // key cap per shard
	held     func(key string) bool
	shards   [numShards]shard
	dirty    atomic.Int64  // entries on dirty lists
	notify   chan struct{} // signalled when dirty goes from 0 to 1
	stats    Stats
}

type shard struct {
	tab   atomic.Pointer[table] // current table; readers load it without locking
	head  atomic.Pointer[Entry] // dirty list (a Treiber stack linked by Entry.link, ending with the store)
	mu    sync.Mutex            // guards writes to tab's slots and control words, live, tombs and hand
	live  int                   // entries in the table
	tombs int                   // tombstones in the table
	hand  uint64                // CLOCK hand
	_     [40]byte              // keep shards on separate cache lines
}

// A table is an open-addressed hash table of groups: seven slots and a control word of eight bytes,
// one byte a slot (and a pad byte), in one 64-byte cache line, as Go's own maps lay them out. A
// slot's byte is a 7-bit tag of its entry's hash (the hash's top 7 of the 32 bits an Entry keeps),
// ctrlEmpty, or ctrlDeleted (a tombstone: probes go on past it). A probe reads a group's control word
// and loads an entry only for a slot whose tag matches (a false match: 1 in 128 a slot), so a lookup
// reads the group's line and its own entry's, not the other entries of its probe. A probe stops at
// the first group with an empty byte; groups are visited in triangular order (g, g+1, g+3, g+6, …
// modulo their number, a power of two: every group once).
//
// Readers load the control word, then the slot, without locking. Writers hold the shard's mutex
// and store a slot before its byte (an insert), or its byte before clearing it (a removal); as both
// are atomic, a reader that sees a tag finds the entry stored before it, or nil (a removal since:
// no match). A key present throughout a lookup is found: it was inserted past a group only if that
// group was full then, and a full group never gets an empty byte back (a removal there leaves a
// tombstone; only a group that still has an empty byte has a removed slot marked empty).
type table struct {
	// groups holds the groups' words, one more group than the table has: group g's control word is
	// groups[g].ctrl and its slots are groups[g+off].slots. The allocator places an array of more
	// than 512 bytes and at most 32 KB with pointers 8 bytes after a 64-byte boundary (the header Go
	// writes before such an object): there groups[g].ctrl starts a line and groups[g+1].slots fill
	// the rest of it, so off is 1. A smaller or larger array starts on a boundary, and off is 0.
	// newTable picks off from the address (TestTableLayout pins that both cases land on one line);
	// were the allocator to place the array otherwise, the table would stay correct, only slower.
	groups []group
	mask   uint64 // the number of groups, minus one
	off    uint64 // 0 or 1: see groups
}

// group is the unit of a table's allocation: seven slots, then a control word. See table.
type group struct {
	slots [groupSlots]atomic.Pointer[Entry]
	ctrl  atomic.Uint64
}

const (
	groupSlots  = 7
	ctrlEmpty   = 0x80 // a free slot: probes stop at its group
	ctrlDeleted = 0xfe // a tombstone (and the control word's eighth byte, which has no slot)
	ctrlLSB     = 0x0101010101010101
	ctrlMSB     = 0x8080808080808080
	// ctrlInit is a new group's control word: seven empty slots and the pad byte.
	ctrlInit = ctrlDeleted<<56 | ctrlEmpty*(ctrlLSB>>8)
)

// tagOf returns the control byte of a slot holding an entry of hash h: its top 7 of 32 bits
// (independent of the shard's bits and, below 2^19 groups a shard, of the group's).
func tagOf(h uint32) uint64 { return uint64(h >> 25) }

// matchTag returns the control word c with bit 7 of each byte that may equal tag set: every byte
// that does, and (rarely: a 0x01 byte above one that does) one that does not, which the caller's
// comparison of the entry rejects. Empty and deleted bytes never match.
func matchTag(c, tag uint64) uint64 {
	v := c ^ tag*ctrlLSB
	return (v - ctrlLSB) &^ v & ctrlMSB
}

// matchEmpty returns c with bit 7 set in each byte that is ctrlEmpty (bit 7 set, bit 1 clear).
func matchEmpty(c uint64) uint64 { return c &^ (c << 6) & ctrlMSB }

// slot returns slot j of group g.
func (t *table) slot(g, j uint64) *atomic.Pointer[Entry] { return &t.groups[g+t.off].slots[j] }

// setLocked stores e in slot j of group g, then its tag: under the shard's mutex.
func (t *table) setLocked(g, j uint64, e *Entry) {
	t.slot(g, j).Store(e)
	c := &t.groups[g].ctrl
	c.Store(c.Load()&^(0xff<<(8*j)) | tagOf(e.hash)<<(8*j))
}

// clearLocked frees slot j of group g, under the shard's mutex: its byte becomes ctrlEmpty when
// the group has an empty byte already (no probe went past the group), and a tombstone otherwise.
// It reports whether it left a tombstone.
func (t *table) clearLocked(g, j uint64) bool {
	c := &t.groups[g].ctrl
	w := c.Load()
	b := uint64(ctrlDeleted)
	if matchEmpty(w) != 0 {
		b = ctrlEmpty
	}
	c.Store(w&^(0xff<<(8*j)) | b<<(8*j))
	t.slot(g, j).Store(nil)
	return b == ctrlDeleted
}

// secondChance returns the entry in slot j of group g when it was not used since the CLOCK bit was
// last cleared, and nil for an empty slot or a used entry (whose bit it clears: CLOCK's second
// chance). The caller holds the shard's mutex.
func (t *table) secondChance(g, j uint64) *Entry {
	e := t.slot(g, j).Load()
	if e == nil {
		return nil
	}
	if e.flags.has(fUsed) {
		e.flags.clear(fUsed)
		return nil
	}
	return e
}

// capacity returns the number of slots.
func (t *table) capacity() int { return int(t.mask+1) * groupSlots }

// New returns an empty store.
func New(cfg Config) (*Store, error) {
	if cfg.MaxKeys < numShards {
		return nil, errors.New("local: MaxKeys must be at least 64")
	}
	// The cap per shard rounds down: rounding up let the store hold up to 63 keys more than MaxKeys
	// (found by hybrid's TestKeyCardinalityAttack: 10,048 keys under a cap of 10,000).
	s := &Store{
		seed:     maphash.MakeSeed(),
		k0:       rand.Uint64(),
		k1:       rand.Uint64() | 1,
		perShard: cfg.MaxKeys / numShards,
		held:     cfg.Held,
		notify:   make(chan struct{}, 1),
	}
	for i := range s.shards {
		s.shards[i].tab.Store(newTable(1))
	}
	return s, nil
}

// newTable returns an empty table of n groups, n a power of two.
func newTable(n int) *table {
	t := &table{groups: make([]group, n+1), mask: uint64(n - 1)}
	if uintptr(unsafe.Pointer(&t.groups[0]))%64 != 0 {
		t.off = 1
	}
	for i := range t.groups {
		t.groups[i].ctrl.Store(ctrlInit)
	}
	return t
}

// Stats returns the store's counters.
func (s *Store) Stats() *Stats { return &s.stats }

// Hash returns the hash the store uses for key; [Store.Lookup] and [Store.Insert] take it so callers
// hash once. It is seeded at random per store, so that keys chosen to collide in one process do not
// collide in another.
//
// Keys up to 32 bytes, most keys, are hashed with wyhash's short-input path, as
// runtime.memhashFallback computes it (Go's map hash where AES is unavailable), written out here:
// hash/maphash reaches the AES hash through three calls, which cost about as much as the rest of a
// lookup, where this is a few loads and multiplies in one call. Its protection against chosen
// collisions is that of Go's maps without AES: random seeds (k0, k1), per store. Longer keys use
// hash/maphash.
func (s *Store) Hash(key string) uint64 {
	n := uint64(len(key))
	if n > 32 {
		return maphash.String(s.seed, key)
	}
	b := unsafe.Slice(unsafe.StringData(key), n)
	seed := s.k0
	var x, y uint64
	switch {
	case n == 0:
		return seed
	case n < 4:
		x = uint64(b[0]) | uint64(b[n>>1])<<8 | uint64(b[n-1])<<16
	case n <= 8:
		x = uint64(binary.LittleEndian.Uint32(b))
		y = uint64(binary.LittleEndian.Uint32(b[n-4:]))
	case n <= 16:
		x = binary.LittleEndian.Uint64(b)
		y = binary.LittleEndian.Uint64(b[n-8:])
	default:
		seed = wymix(binary.LittleEndian.Uint64(b)^s.k1, binary.LittleEndian.Uint64(b[8:])^seed)
		x = binary.LittleEndian.Uint64(b[n-16:])
		y = binary.LittleEndian.Uint64(b[n-8:])
	}
	return wymix(wyp5^n, wymix(x^s.k1, y^seed^wyp0))
}

// The multipliers of wyhash (public domain), which Hash uses as the Go runtime does.
const (
	wyp0 = 0xa0761d6478bd642f
	wyp5 = 0x1d8e4e27c47d124f
)

// wymix is wyhash's mixing step: the two halves of the 128-bit product, xored.
func wymix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// Lookup returns the entry for key, or nil; h is Hash(key). It never blocks and never allocates.
// A key has one entry whatever its limit, as it has one bucket in Redis (central.BucketKey): the
// entry's limit is the one it was last given ([Entry.SetLimit]).
func (s *Store) Lookup(key string, h uint64) *Entry {
	t := s.shards[h&(numShards-1)].tab.Load()
	tag := tagOf(uint32(h))
	g := home(h) & t.mask
	for step := uint64(1); ; step++ {
		c := t.groups[g].ctrl.Load()
		for m := matchTag(c, tag); m != 0; m &= m - 1 {
			e := t.slot(g, uint64(bits.TrailingZeros64(m)>>3)).Load()
			if e != nil && e.hash == uint32(h) && e.key == key {
				return e
			}
		}
		if matchEmpty(c) != 0 {
			return nil
		}
		g = (g + step) & t.mask
	}
}

// Take is the hot path's lookup and take in one call: when key has an entry whose limit is
// (rate, burst) and whose local allowance covers n, it takes n tokens as [Entry.TryTake] does and
// returns the entry, counting the decision in Stats.Taken (see there: the count lags); otherwise it
// returns nil and has taken and counted nothing (no entry, another limit, an allowance too small,
// an entry held ([Store.Hold]) or evicted concurrently), and the caller goes the long way:
// [Store.Lookup], [Entry.SetLimit], [Entry.TryTake], [Store.Insert]. h is Hash(key). It never
// blocks, never allocates and reads no clock.
//
// It is Lookup, HasLimit and TryTake written out in one function, so that a decision from local
// allowance costs one call into the store rather than three, with TryTake's rare steps (a CAS lost to
// another caller, the CLOCK bit or the dirty list to set, an eviction) out of line.
func (s *Store) Take(key string, h uint64, rate float64, burst, n int64) *Entry {
	t := s.shards[h&(numShards-1)].tab.Load()
	tag := tagOf(uint32(h))
	g := home(h) & t.mask
	var e *Entry
probe:
	for step := uint64(1); ; step++ {
		c := t.groups[g].ctrl.Load()
		for m := matchTag(c, tag); m != 0; m &= m - 1 {
			e = t.slot(g, uint64(bits.TrailingZeros64(m)>>3)).Load()
			if e != nil && e.hash == uint32(h) {
				break probe
			}
		}
		if matchEmpty(c) != 0 {
			return nil
		}
		g = (g + step) & t.mask
	}
	// The key is compared out of the probe's loop, where fewer values live across memequal's call.
	// Another key with the same 32 hash bits (1 in 2^25 of the keys whose tag matched) takes the
	// long way: Lookup's probe, which compares every key.
	if e.key != key {
		if e = s.Lookup(key, h); e == nil {
			return nil
		}
	}
	if e.rate.Load() != math.Float64bits(rate) || e.burst.Load() != burst {
		return nil
	}
	if f := e.flags.v.Load(); f&(fHeld|fSplit) != 0 {
		if f&fHeld != 0 {
			return nil
		}
		return s.takeSplit(e, n) // see split
	}
	w := e.word.Load()
	if tot(w)+n > e.mark.Load() || !e.word.CompareAndSwap(w, w+n+oneTake) {
		return s.takeSlow(e, n)
	}
	w += n + oneTake
	if f := e.flags.v.Load(); f&(fEvicted|fUsed|fDirty) != fUsed|fDirty || uint64(w) < oneTake {
		return s.afterTake(e, f, w, n)
	}
	return e
}

// takeSlow is Take after its first attempt at the allowance failed (too small, or a CAS lost to a
// concurrent take or fold): Entry.TryTake's loop, counting the decision as Take does. It returns
// e when it took the tokens and nil otherwise.
//
//go:noinline
func (s *Store) takeSlow(e *Entry, n int64) *Entry {
	for {
		w := e.word.Load()
		if tot(w)+n > e.mark.Load() {
			return nil
		}
		// The allowance covers n, so Take's CAS (or the last one here) lost to another take or a
		// fold: count it, and split a key that loses many (see split).
		s.contended(e)
		if e.word.CompareAndSwap(w, w+n+oneTake) {
			return s.afterTake(e, e.flags.v.Load(), w+n+oneTake, n)
		}
	}
}

// afterTake is Take's end when the word it left (w) or the flags it read after taking n tokens
// (f) say more is to do: the count's wrap (this decision made it 256: they go to Stats.Taken),
// TryTake's handshake with an eviction, the CLOCK bit and the dirty list. It returns e, or nil
// when the entry was evicted (the take is undone, its decision with it).
//
//go:noinline
func (s *Store) afterTake(e *Entry, f uint32, w, n int64) *Entry {
	if uint64(w) < oneTake {
		s.stats.Taken.Add(takeWrap)
		if f&lostMask != 0 {
			e.flags.v.And(^uint32(lostMask)) // a new window for the lost CASes (see split)
		}
	}
	if f&fEvicted != 0 {
		s.untake(e, n)
		return nil
	}
	e.noteUse(f)
	return e
}

// untake undoes a take of n tokens and one decision that found e evicted (see untakeWord).
func (s *Store) untake(e *Entry, n int64) { s.untakeWord(&e.word, -n) }

// untakeWord undoes a take that found its entry evicted: it adds d to the tokens in w (an entry's
// word, whose tokens are consumption: d = −n; or a slot's, whose tokens are held: d = +n) and takes
// one decision off the count in w, or, when a fold (or the take's own wrap) has already moved it
// to Stats.Taken and the count is 0, off Stats.Taken.
func (s *Store) untakeWord(w *atomic.Int64, d int64) {
	for {
		v := w.Load()
		if takes(v) != 0 {
			if w.CompareAndSwap(v, v+d-oneTake) {
				return
			}
			continue
		}
		if w.CompareAndSwap(v, v+d) {
			s.stats.Taken.Add(-1)
			return
		}
	}
}

// noteUse sets e's CLOCK bit and puts it on the dirty list, unless the flags f read after a take
// show them done already.
func (e *Entry) noteUse(f uint32) {
	if f&fUsed == 0 {
		e.flags.set(fUsed)
	}
	if f&fDirty == 0 {
		e.markDirty()
	}
}

// fold moves the decisions counted in e's word, and in its slots' if it is split, to Stats.Taken.
func (s *Store) fold(e *Entry) {
	s.foldWord(&e.word)
	if sp := e.splitOf(); sp != nil {
		for i := range sp.slots {
			s.foldWord(&sp.slots[i].word)
		}
	}
}

// home returns the group a key of hash h probes from, before the table's mask: the bits above the
// shard's of the low 32 bits, the part of the hash an Entry keeps (a rebuild finds the same group).
func home(h uint64) uint64 { return uint64(uint32(h)) >> shardBits }

// Len returns the number of keys tracked.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.live
		sh.mu.Unlock()
	}
	return n
}

// Insert returns the entry for key, creating it if needed under the limit (rate, burst) with an
// allowance of credit tokens (its cold-start credit: 0 sends every take to Redis until a reconcile
// answers). h is Hash(key). An entry that exists is returned as it is, with its limit, lease and
// credit (the caller sets a changed limit with [Entry.SetLimit]): a key whose limit changes keeps
// its entry, so no second cold-start credit or lease is granted for it. It returns nil when the
// shard is at its cap and every key in it has pending consumption; the caller then decides without
// local state.
func (s *Store) Insert(key string, h uint64, rate float64, burst, credit int64) *Entry {
	sh := &s.shards[h&(numShards-1)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tab.Load()
	g, j, free := sh.findLocked(t, key, h)
	if g >= 0 {
		return t.slot(uint64(g), uint64(j)).Load()
	}
	if sh.live >= s.perShard && !s.evictLocked(sh) {
		s.stats.Full.Add(1)
		return nil
	}
	e := &Entry{key: key, hash: uint32(h), inc: incarnations.Add(1), link: unsafe.Pointer(s)}
	e.SetLimit(rate, burst)
	if s.held != nil && s.held(key) {
		e.flags.set(fHeld) // before the entry is published: no Take sees it unheld
	}
	e.mark.Store(max(credit, 0))
	e.globalMicro.Store(burst * 1_000_000) // until Redis answers, Remaining assumes a full bucket
	e.setRem()
	if (sh.live+sh.tombs+1)*4 > t.capacity()*3 {
		t = sh.rebuildLocked(sh.live + 1)
		free = freeSlot{}
	}
	if !free.ok {
		free = t.freeLocked(h)
	}
	if free.tomb {
		sh.tombs--
	}
	t.setLocked(free.g, free.j, e)
	sh.live++
	s.stats.Inserts.Add(1)
	return e
}

// Hold holds key's entry, if it has one, and reports whether it had: [Store.Take] returns nil for a
// held entry, taking nothing, until [Store.Release], so its decisions go the long way, where the
// caller checks what Take cannot (hybrid: a ban of the key). Lookup, TryTake and the entry's other
// methods are unaffected. A Take that read the entry's flags before Hold may still take.
//
// Hold runs under the shard's lock, as Insert and Release do, so a caller that records a key as to
// be held (where Config.Held reads it) and then calls Hold leaves no entry of the key unheld: an
// entry inserted before Hold is held by it, one inserted after it is created held.
func (s *Store) Hold(key string, h uint64) bool {
	sh := &s.shards[h&(numShards-1)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := s.Lookup(key, h)
	if e != nil {
		e.flags.set(fHeld)
	}
	return e != nil
}

// Release undoes [Store.Hold] for e unless Config.Held still reports its key, and reports whether
// e is released. Like Hold it runs under the shard's lock, so a Hold of the key that starts after
// Config.Held reported it is not undone.
func (s *Store) Release(e *Entry) bool {
	sh := &s.shards[uint64(e.hash)&(numShards-1)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s.held != nil && s.held(e.key) {
		return false
	}
	e.flags.clear(fHeld)
	return true
}

// Remove drops the entry for key whatever it holds, and reports whether there was one; h is
// Hash(key). Its pending consumption and unused lease are forgotten (the caller reset the key's
// bucket). A concurrent TryTake on the removed entry either completed before, or reports Gone.
func (s *Store) Remove(key string, h uint64) bool {
	sh := &s.shards[h&(numShards-1)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tab.Load()
	g, j, _ := sh.findLocked(t, key, h)
	if g < 0 {
		return false
	}
	e := t.slot(uint64(g), uint64(j)).Load()
	e.flags.set(fEvicted)
	s.fold(e)
	sh.dropLocked(t, uint64(g), uint64(j))
	return true
}

// freeSlot is a free slot of a table: slot j of group g, a tombstone or empty; ok is false for
// none.
type freeSlot struct {
	g, j     uint64
	tomb, ok bool
}

// findLocked returns where key's entry is in t (group g and slot j; g is −1 when key has none) and
// the first free slot of key's probe, up to the group that ended it. The caller holds sh.mu.
func (sh *shard) findLocked(t *table, key string, h uint64) (g, j int, free freeSlot) {
	tag := tagOf(uint32(h))
	i := home(h) & t.mask
	for step := uint64(1); ; step++ {
		c := t.groups[i].ctrl.Load()
		for m := matchTag(c, tag); m != 0; m &= m - 1 {
			k := uint64(bits.TrailingZeros64(m) >> 3)
			if e := t.slot(i, k).Load(); e != nil && e.hash == uint32(h) && e.key == key {
				return int(i), int(k), free
			}
		}
		if !free.ok {
			if m := c & ctrlMSB &^ (0xff << 56); m != 0 { // an empty or deleted slot
				k := uint64(bits.TrailingZeros64(m) >> 3)
				free = freeSlot{g: i, j: k, tomb: c>>(8*k)&0xff == ctrlDeleted, ok: true}
			}
		}
		if matchEmpty(c) != 0 {
			return -1, -1, free
		}
		i = (i + step) & t.mask
	}
}

// freeLocked returns the first free slot of the probe of hash h in t, which has one (a table is
// never more than 3/4 full). The caller holds the shard's mutex.
func (t *table) freeLocked(h uint64) freeSlot {
	g := home(h) & t.mask
	for step := uint64(1); ; step++ {
		c := t.groups[g].ctrl.Load()
		if m := c & ctrlMSB &^ (0xff << 56); m != 0 {
			j := uint64(bits.TrailingZeros64(m) >> 3)
			return freeSlot{g: g, j: j, tomb: c>>(8*j)&0xff == ctrlDeleted, ok: true}
		}
		g = (g + step) & t.mask
	}
}

// dropLocked frees slot j of group g of the shard's current table t, whose entry leaves the store;
// the caller holds sh.mu.
func (sh *shard) dropLocked(t *table, g, j uint64) {
	if t.clearLocked(g, j) {
		sh.tombs++
	}
	sh.live--
}

// rebuildLocked replaces the table with one sized for want live entries at most half full,
// dropping tombstones. Readers of the old table still find every entry that existed before.
func (sh *shard) rebuildLocked(want int) *table {
	n := 1
	for n*groupSlots < want*2 {
		n *= 2
	}
	old := sh.tab.Load()
	t := newTable(n)
	for g := uint64(0); g <= old.mask; g++ {
		for j := uint64(0); j < groupSlots; j++ {
			if e := old.slot(g, j).Load(); e != nil {
				f := t.freeLocked(uint64(e.hash))
				t.setLocked(f.g, f.j, e)
			}
		}
	}
	sh.tab.Store(t)
	sh.tombs = 0
	return t
}

// evictLocked evicts one clean entry of the shard, CLOCK order: a recently used entry gets a second
// chance. It reports whether it freed a slot.
func (s *Store) evictLocked(sh *shard) bool {
	t := sh.tab.Load()
	n := (t.mask + 1) * 8 // eight positions a group: seven slots and the pad byte's, skipped
	for k := uint64(0); k < 2*n+1; k++ {
		i := sh.hand % n
		sh.hand++
		g, j := i>>3, i&7
		if j == groupSlots {
			continue
		}
		e := t.secondChance(g, j)
		if e == nil || !e.tryEvict() {
			continue
		}
		s.fold(e)
		sh.dropLocked(t, g, j)
		s.stats.Evictions.Add(1)
		return true
	}
	return false
}

// Sweep evicts the entries that went idle, and shrinks the tables they leave mostly empty so that
// their memory can go back to the runtime (and from it to the OS). An entry is evicted when, at
// time now (the callers' monotonic clock, ns), it
//   - was not used since the previous Sweep (Sweep clears the CLOCK reference bit of the others),
//   - is clean: Redis has counted all of its consumption (tryEvict; an unused lease is given up),
//   - and its last answer from Redis is at least max(idle, Burst/Rate) old, Burst/Rate being the
//     time its bucket takes to refill from empty: a node that sees the key again asks Redis (or
//     takes a cold-start credit) about a bucket that refilled meanwhile, as after the first sight.
//
// A key used between two sweeps is kept; one idle for two sweeps at an interval of at least idle
// (and for its refill time) is evicted. It returns the number of entries evicted; they count in
// Stats.Evictions. Sweep takes each shard's mutex in turn; lookups go on without locking.
func (s *Store) Sweep(now, idle int64) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		t := sh.tab.Load()
		for g := uint64(0); g <= t.mask; g++ {
			for j := uint64(0); j < groupSlots; j++ {
				e := t.secondChance(g, j)
				if e == nil || now-e.GrantedAt() < max(idle, e.refillNanos()) || !e.tryEvict() {
					continue
				}
				s.fold(e)
				sh.dropLocked(t, g, j)
				n++
			}
		}
		if t.capacity() > minTable && (sh.live*8 < t.capacity() || sh.tombs > sh.live) {
			sh.rebuildLocked(sh.live)
		}
		sh.mu.Unlock()
	}
	s.stats.Evictions.Add(int64(n))
	return n
}

// TableSlots returns the slots of the store's tables, for tests and memory estimates: a table
// costs 64 bytes per seven slots (a group), and one group more.
func (s *Store) TableSlots() int {
	n := 0
	for i := range s.shards {
		n += s.shards[i].tab.Load().capacity()
	}
	return n
}

// Notify returns a channel that receives a value when the first entry becomes dirty after the dirty
// lists were emptied. The syncer waits on it so that an idle limiter never ticks.
func (s *Store) Notify() <-chan struct{} { return s.notify }

// Dirty returns the number of entries waiting on dirty lists.
func (s *Store) Dirty() int64 { return s.dirty.Load() }

// markDirty puts e on its store's dirty list unless it is already there. Only the caller that
// sets fDirty touches e.link until Collect takes e off the list: the store it reads there is
// written back by Collect before Collect clears the flag.
func (e *Entry) markDirty() {
	if e.flags.has(fDirty) || !e.flags.setOnce(fDirty) {
		return
	}
	s := (*Store)(e.link)
	sh := &s.shards[e.hash&(numShards-1)]
	for {
		old := sh.head.Load()
		if old == nil {
			e.link = unsafe.Pointer(s) // the list's end
		} else {
			e.link = unsafe.Pointer(old)
		}
		if sh.head.CompareAndSwap(old, e) {
			break
		}
	}
	if s.dirty.Add(1) == 1 {
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
}

// MarkDirty puts e back on the dirty list, e.g. after its reconcile failed.
func (s *Store) MarkDirty(e *Entry) { e.markDirty() }

// Collect moves every dirty entry to buf (which it returns, appended), clears their dirty flags and
// adds the decisions [Store.Take] counted in them to Stats.Taken. An entry consumed again after
// Collect read it becomes dirty again.
func (s *Store) Collect(buf []*Entry) []*Entry {
	for i := range s.shards {
		e := s.shards[i].head.Swap(nil)
		k := int64(0)
		for e != nil {
			next := e.link
			e.link = unsafe.Pointer(s)
			if e.flags.v.And(^fDirty)&lostMask != 0 {
				e.flags.v.And(^uint32(lostMask)) // a new window for the lost CASes (see split)
			}
			s.fold(e) // after the clear: a decision the fold misses sees the flag clear and marks e dirty again
			buf = append(buf, e)
			k++
			if next == unsafe.Pointer(s) {
				break
			}
			e = (*Entry)(next)
		}
		if k > 0 {
			s.dirty.Add(-k)
		}
	}
	return buf
}
