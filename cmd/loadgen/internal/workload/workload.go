// Package workload generates the load generator's request stream: which key each request is for
// (uniform, Zipf or one hot key), which node it goes to (key affinity) and when it is sent (token
// pacing toward a target rate, or as fast as possible). It reads no clock: callers pass the time
// since the run started.
package workload

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Pattern is a key access pattern.
type Pattern int

// The access patterns.
const (
	// Uniform picks every key with the same probability.
	Uniform Pattern = iota + 1
	// Zipf picks key i with probability proportional to 1/(1+i)^s: key 0 is the hottest.
	Zipf
	// Hot sends every request to key 0.
	Hot
	// Churn is a stream of new keys: ChurnHotShare of the requests go to the ChurnHotKeys first
	// keys, the rest to cold keys each requested once or twice (twice with probability 1/2, the
	// second time right after the first), every worker walking its own part of the key space. A
	// worker that has walked all of it starts over. Use [NewChurnPicker].
	Churn
)

// The shape of the Churn pattern.
const (
	ChurnHotKeys  = 4
	ChurnHotShare = 0.1
)

// ParsePattern parses "uniform", "zipf", "hot" or "churn".
func ParsePattern(s string) (Pattern, error) {
	switch s {
	case "uniform":
		return Uniform, nil
	case "zipf":
		return Zipf, nil
	case "hot":
		return Hot, nil
	case "churn":
		return Churn, nil
	}
	return 0, fmt.Errorf("unknown pattern %q (want uniform, zipf, hot or churn)", s)
}

// String returns the name ParsePattern accepts.
func (p Pattern) String() string {
	switch p {
	case Uniform:
		return "uniform"
	case Zipf:
		return "zipf"
	case Hot:
		return "hot"
	case Churn:
		return "churn"
	}
	return fmt.Sprintf("Pattern(%d)", int(p))
}

// Picker picks the key of each request. It is not safe for concurrent use: give each worker its own.
type Picker struct {
	p    Pattern
	keys int
	rng  *rand.Rand
	zipf *rand.Zipf

	// Churn: this worker's walk over the cold keys ChurnHotKeys to keys-1.
	stride, next int  // the walk visits next, next+stride, … (mod the cold keys)
	last         int  // the last cold key
	again        bool // request last once more
}

// NewPicker returns a picker over keys keys (0 to keys-1). s is the Zipf exponent, above 1 (used
// only by Zipf). The same seed and stream give the same sequence of keys.
func NewPicker(p Pattern, keys int, s float64, seed, stream uint64) (*Picker, error) {
	if keys < 1 {
		return nil, fmt.Errorf("workload: %d keys: want at least 1", keys)
	}
	pk := &Picker{p: p, keys: keys, rng: rand.New(rand.NewPCG(seed, stream))}
	switch p {
	case Uniform, Hot:
	case Churn:
		return nil, fmt.Errorf("workload: churn: use NewChurnPicker")
	case Zipf:
		if !(s > 1) {
			return nil, fmt.Errorf("workload: zipf exponent %v: want above 1", s)
		}
		pk.zipf = rand.NewZipf(pk.rng, s, 1, uint64(keys-1))
	default:
		return nil, fmt.Errorf("workload: unknown pattern %d", int(p))
	}
	return pk, nil
}

// NewChurnPicker returns a picker of the Churn pattern over keys keys for worker stream of
// streams: the workers' walks over the cold keys do not overlap until they start over.
func NewChurnPicker(keys int, seed, stream uint64, streams int) (*Picker, error) {
	if keys <= ChurnHotKeys {
		return nil, fmt.Errorf("workload: churn over %d keys: want more than %d", keys, ChurnHotKeys)
	}
	if streams < 1 || stream >= uint64(streams) {
		return nil, fmt.Errorf("workload: churn stream %d of %d", stream, streams)
	}
	return &Picker{p: Churn, keys: keys, rng: rand.New(rand.NewPCG(seed, stream)), stride: streams, next: int(stream)}, nil
}

// Next returns the next key number.
func (pk *Picker) Next() int {
	switch pk.p {
	case Churn:
		if pk.rng.Float64() < ChurnHotShare {
			return pk.rng.IntN(ChurnHotKeys)
		}
		if pk.again {
			pk.again = false
			return pk.last
		}
		cold := pk.keys - ChurnHotKeys
		pk.last = ChurnHotKeys + pk.next%cold
		pk.next += pk.stride
		pk.again = pk.rng.IntN(2) == 0
		return pk.last
	case Zipf:
		return int(pk.zipf.Uint64())
	case Hot:
		return 0
	}
	return pk.rng.IntN(pk.keys)
}

// Pacer spaces one worker's requests at a steady rate (token pacing): a request is due every
// 1/rate seconds. A worker that falls behind catches up at once, but by at most MaxLag of backlog,
// so a stall (a GC pause, a slow Redis) does not end in an unbounded burst: the requests beyond
// that are skipped, which is why the achieved rate is measured, not assumed.
type Pacer struct {
	interval float64 // ns between requests; 0 = no pacing
	next     float64 // ns since start when the next request is due
	maxLag   float64 // ns
	skipped  int64
}

// MaxLag is the most backlog a Pacer lets a worker catch up on.
const MaxLag = 20 * time.Millisecond

// NewPacer returns a pacer for rate requests per second; rate 0 means as fast as possible.
func NewPacer(rate float64) *Pacer {
	p := &Pacer{maxLag: float64(MaxLag)}
	if rate > 0 {
		p.interval = 1e9 / rate
	}
	return p
}

// Next reports how long the worker must wait, at now (time since the run started), before its
// next request. Zero means send now: the request's slot is taken.
func (p *Pacer) Next(now time.Duration) time.Duration {
	if p.interval == 0 {
		return 0
	}
	t := float64(now)
	if p.next > t {
		return time.Duration(p.next-t) + 1
	}
	if lag := t - p.next; lag > p.maxLag {
		skip := int64((lag - p.maxLag) / p.interval)
		p.skipped += skip
		p.next += float64(skip) * p.interval
	}
	p.next += p.interval
	return 0
}

// Skipped returns the requests skipped because the worker was more than MaxLag behind.
func (p *Pacer) Skipped() int64 { return p.skipped }

// Router picks the node each request goes to under key affinity: a share of each key's requests
// goes to the key's home node ([Home]), the rest uniformly to the other nodes. It is not safe for
// concurrent use: give each worker its own.
type Router struct {
	nodes    int
	affinity float64
	rng      *rand.Rand
}

// NewRouter returns a router over nodes nodes that sends the fraction affinity (0 to 1) of each
// key's requests to its home node. The same seed and stream give the same sequence of nodes.
func NewRouter(nodes int, affinity float64, seed, stream uint64) (*Router, error) {
	if nodes < 1 {
		return nil, fmt.Errorf("workload: %d nodes: want at least 1", nodes)
	}
	if !(affinity >= 0 && affinity <= 1) {
		return nil, fmt.Errorf("workload: affinity %v: want 0 to 1", affinity)
	}
	// A stream of its own, apart from the Picker's, so that routing does not change the keys.
	return &Router{nodes: nodes, affinity: affinity, rng: rand.New(rand.NewPCG(seed^0x9e3779b97f4a7c15, stream))}, nil
}

// Node returns the node of the next request for key k. With one node it is always 0.
func (r *Router) Node(k int) int {
	home := Home(k, r.nodes)
	if r.nodes == 1 || r.rng.Float64() < r.affinity {
		return home
	}
	n := r.rng.IntN(r.nodes - 1) // one of the others
	if n >= home {
		n++
	}
	return n
}

// Home returns the home node of key k among nodes nodes: a hash of the key number (splitmix64's
// finaliser), modulo nodes.
func Home(k, nodes int) int {
	z := uint64(k) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return int(z % uint64(nodes))
}
