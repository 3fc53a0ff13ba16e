package hybrid

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/outcome"
)

// banWatch is what the limiter knows of the ban list beyond its local copy. The local copy (the deny
// cache) holds at most options.maxBans bans; when Redis holds more, a key missing from it may still
// be banned, so the keys this node reconciles or takes are checked in Redis (central.BannedKeys),
// each at most once per banCheckEvery, and the bans found join the local copy.
type banWatch struct {
	total atomic.Int64 // entries in Redis's ban list, as last read
	known atomic.Bool  // the ban list has been read at least once (total is its size)

	mu     sync.Mutex          // guards seen and queue
	seen   map[string]struct{} // keys queued since the last reset
	queue  []string            // keys to check
	notify chan struct{}       // buffered 1: the queue has keys
}

func (w *banWatch) init() {
	w.seen = make(map[string]struct{})
	w.notify = make(chan struct{}, 1)
}

// add queues key for a check, unless it was queued since the last reset.
func (w *banWatch) add(key string) {
	w.mu.Lock()
	if _, ok := w.seen[key]; ok || len(w.seen) >= maxBanChecks {
		w.mu.Unlock()
		return
	}
	w.seen[key] = struct{}{}
	w.queue = append(w.queue, key)
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

func (w *banWatch) drain() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.queue
	w.queue = nil
	return q
}

func (w *banWatch) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.seen)
}

// incomplete reports whether Redis holds more bans than the local copy can.
func (l *Limiter) bansIncomplete() bool { return l.bans.total.Load() > int64(l.opts.maxBans) }

// bansComplete reports whether the local copy of the ban list is known to hold every ban: the list
// has been read and fits. Until then, a key missing from the copy may be banned, so a new key gets
// no cold-start credit: its first decision goes to Redis, whose scripts read the key's ban in its
// bucket (central.Client.Ban), and a banned key is never admitted once its ban is in Redis.
func (l *Limiter) bansComplete() bool { return l.bans.known.Load() && !l.bansIncomplete() }

// BansLoaded reports whether the limiter has read the ban list from Redis since it started (a few
// milliseconds after New while Redis is up). Until it has, and while Redis holds more bans than its
// local copy keeps (Stats: BanListSize above Bans), a key this limiter has not seen gets no
// cold-start credit: its first decision goes to Redis, which reads the key's ban, so that a banned
// key is never admitted once its ban is in Redis. A process that wants its first decisions local
// can wait for it before serving.
func (l *Limiter) BansLoaded() bool { return l.bans.known.Load() }

// onBanTotal records the size of Redis's ban list after a read.
func (l *Limiter) onBanTotal(n int64) {
	l.bans.total.Store(n)
	l.bans.known.Store(true)
}

// banned answers a decision Redis refused because key is banned (central.StatusBanned): the ban
// joins the local copy, so that the key's next decisions are denied without I/O.
func (l *Limiter) banned(key string, limit Limit, retry time.Duration) Decision {
	retry = max(retry, time.Millisecond)
	l.ban(key, l.opts.now().Add(retry))
	return Decision{Limit: limit, RetryAfter: retry, ResetAfter: retry, Source: outcome.SourceDenyCache}
}

// checkBans checks the queued keys in Redis until ctx ends; see banWatch.
func (l *Limiter) checkBans(ctx context.Context, onErr func(error)) {
	t := time.NewTicker(banCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			l.bans.reset()
		case <-l.bans.notify:
			keys := l.bans.drain()
			for lo := 0; lo < len(keys); lo += central.MaxBanCheck {
				batch := keys[lo:min(lo+central.MaxBanCheck, len(keys))]
				rem, err := l.central.BannedKeys(ctx, batch)
				if err != nil {
					if ctx.Err() == nil {
						onErr(err)
					}
					break // the keys are queued again when next reconciled
				}
				now := l.opts.now()
				for i, d := range rem {
					if d > 0 {
						l.ban(batch[i], now.Add(d))
					}
				}
			}
		}
	}
}
