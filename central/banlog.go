package central

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// BanChangesKey returns the Redis key of the ban change log, a sorted set of the keys banned or
// unbanned in the last 10 minutes by change time. It is [BansKey] with a suffix, so that it shares the
// ban list's hash tag (one Cluster slot for both).
func BanChangesKey(prefix string) string { return BansKey(prefix) + ":changes" }

func (c *Client) banKeys() []string {
	return []string{BansKey(c.cfg.Prefix), BanChangesKey(c.cfg.Prefix)}
}

// BanChanges is one page of the ban change log; see [Client.BanChangesSince].
type BanChanges struct {
	// Events are the keys banned or unbanned at or after since, with their state now: Banned with
	// the remaining TTL, or not banned (unbanned, or expired since).
	Events []BanEvent
	// Next is where the next call starts.
	Next BanCursor
	// More reports that another page is waiting: call again with Next at once.
	More bool
	// Reload reports that since is older than the log keeps (10 minutes): the caller must load the
	// whole list again ([Client.ScanBans]). Events is then empty.
	Reload bool
	// Total is the number of entries in the ban list (bans whose expiry has not been cleaned up yet
	// included).
	Total int64
}

// BanCursor is a position in the ban change log: the changes at or after Since (ms of Redis TIME),
// less the first Skip of those made at Since exactly.
type BanCursor struct {
	Since int64
	Skip  int64
}

// BanChangesSince returns the ban changes from cursor on (see [BanChanges.Next]; a cursor with Since
// from [Client.ScanBans]'s time and no Skip starts at a full load), at most page of them (1 to
// 100,000). Its cost is O(log N + page): a node that keeps up with the changes never rereads the list.
// A change may be returned twice (one made in the millisecond a read ended), never missed while the
// log reaches back to the cursor, so long as Redis's clock does not step back.
func (c *Client) BanChangesSince(ctx context.Context, cursor BanCursor, page int) (BanChanges, error) {
	if page < 1 || page > 100000 {
		return BanChanges{}, fmt.Errorf("%w: ban page %d out of range [1, 100000]", ErrInvalid, page)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	res, err := c.runner.Run(ctx, c.flushRDB, banScript, c.banKeys(), "changes", "",
		strconv.FormatInt(cursor.Since, 10), strconv.Itoa(page), strconv.FormatInt(cursor.Skip, 10))
	if err != nil {
		return BanChanges{}, fmt.Errorf("central: ban changes: %w", err)
	}
	vals, ok := res.([]any)
	if !ok || len(vals) < 6 || len(vals)%2 != 0 {
		return BanChanges{}, fmt.Errorf("%w: ban changes %T", ErrBadReply, res)
	}
	var head [6]int64
	for i := range head {
		if head[i], ok = vals[i].(int64); !ok {
			return BanChanges{}, fmt.Errorf("%w: ban changes element %d is %T", ErrBadReply, i, vals[i])
		}
	}
	out := BanChanges{Reload: head[1] == 1, Total: head[2], Next: BanCursor{Since: head[3], Skip: head[5]}, More: head[4] == 1}
	out.Events, err = decodeBans(vals[6:], zeroIsUnban)
	return out, err
}

// ScanBans returns one page of the ban list: the bans in force among about page entries from cursor
// ("0" to start), the cursor of the next page ("0" when the scan is complete) and Redis's time (ms)
// when the page was read. A full scan may return a ban twice (HSCAN's guarantee). Expired entries it
// meets are removed. Each call costs O(page), so reading a large list never blocks Redis for long.
func (c *Client) ScanBans(ctx context.Context, cursor string, page int) (bans []BanEvent, next string, now int64, err error) {
	if page < 1 || page > 100000 {
		return nil, "", 0, fmt.Errorf("%w: ban page %d out of range [1, 100000]", ErrInvalid, page)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	res, err := c.runner.Run(ctx, c.flushRDB, banScript, c.banKeys(), "scan", "", cursor, strconv.Itoa(page))
	if err != nil {
		return nil, "", 0, fmt.Errorf("central: scan bans: %w", err)
	}
	vals, ok := res.([]any)
	if !ok || len(vals) < 2 || len(vals)%2 != 0 {
		return nil, "", 0, fmt.Errorf("%w: ban scan %T", ErrBadReply, res)
	}
	next, ok1 := vals[0].(string)
	now, ok2 := vals[1].(int64)
	if !ok1 || !ok2 {
		return nil, "", 0, fmt.Errorf("%w: ban scan header %T %T", ErrBadReply, vals[0], vals[1])
	}
	bans, err = decodeBans(vals[2:], zeroIsInvalid)
	return bans, next, now, err
}

// MaxBanCheck is the most keys one [Client.BannedKeys] call takes.
const MaxBanCheck = 1000

// BannedKeys reports, for each of keys (at most MaxBanCheck), how long it stays banned: zero when it
// is not banned. One script call (HMGET on the ban list): it lets a node whose local ban set cannot
// hold every ban check the keys it meets.
func (c *Client) BannedKeys(ctx context.Context, keys []string) ([]time.Duration, error) {
	if len(keys) > MaxBanCheck {
		return nil, fmt.Errorf("%w: %d keys to check, at most %d", ErrInvalid, len(keys), MaxBanCheck)
	}
	out := make([]time.Duration, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	args := make([]any, 0, 4+len(keys))
	args = append(args, "check", "", "", "0")
	for _, k := range keys {
		args = append(args, k)
	}
	res, err := c.runner.Run(ctx, c.flushRDB, banScript, c.banKeys(), args...)
	if err != nil {
		return nil, fmt.Errorf("central: check bans: %w", err)
	}
	vals, ok := res.([]any)
	if !ok || len(vals) != len(keys) {
		return nil, fmt.Errorf("%w: ban check %T of length %d for %d keys", ErrBadReply, res, lenOf(res), len(keys))
	}
	for i, v := range vals {
		ms, ok := v.(int64)
		if !ok || ms < 0 || ms > 1e12 {
			return nil, fmt.Errorf("%w: ban check element %d: %v", ErrBadReply, i, v)
		}
		out[i] = time.Duration(ms) * time.Millisecond
	}
	return out, nil
}

// zeroMeans says what a remaining time of 0 means in a reply of ban entries.
type zeroMeans uint8

const (
	zeroIsInvalid zeroMeans = iota // a list of bans in force: 0 is a bad reply
	zeroIsUnban                    // a change log: 0 means the key was unbanned
)

// decodeBans decodes flat {key, remaining_ms, ...}; zero says what a remaining time of 0 means.
func decodeBans(vals []any, zero zeroMeans) ([]BanEvent, error) {
	out := make([]BanEvent, 0, len(vals)/2)
	for i := 0; i+1 < len(vals); i += 2 {
		k, ok1 := vals[i].(string)
		ms, ok2 := vals[i+1].(int64)
		if !ok1 || !ok2 || ms < 0 || ms > 1e12 || ms == 0 && zero != zeroIsUnban {
			return nil, fmt.Errorf("%w: ban entry %T %v", ErrBadReply, vals[i], vals[i+1])
		}
		out = append(out, BanEvent{Key: k, Banned: ms > 0, TTL: time.Duration(ms) * time.Millisecond})
	}
	return out, nil
}

// BanWatch configures [Client.WatchBans].
type BanWatch struct {
	// Refresh is how often the change log is read, to catch changes whose Pub/Sub message was lost.
	Refresh time.Duration
	// Page is the page size of the reads (ScanBans, BanChangesSince), 1 to 100,000.
	Page int
	// Sweep, if positive, is the page size (up to 100,000) of one more ScanBans call every Refresh,
	// resuming where the last one stopped, which removes expired entries from the list: without
	// full reloads nothing else does while bans keep the list alive.
	Sweep int
	// OnEvent receives each change: from Pub/Sub at once, and again from the change log.
	OnEvent func(BanEvent)
	// OnLoad receives the whole list after a full load (at the first subscription, and when the
	// change log no longer reaches back to the last read); the caller replaces its set with it.
	OnLoad func([]BanEvent)
	// OnTotal, if not nil, receives the number of entries in the ban list after each read.
	OnTotal func(int64)
	// OnError receives errors; it must not block.
	OnError func(error)
}

// WatchBans delivers ban changes until ctx ends. It subscribes to the ban channel; on the first
// subscription it loads the whole list page by page (ScanBans) and hands it to OnLoad; then, every
// Refresh and on every resubscription, it reads only the changes since its last read
// (BanChangesSince), so a node that missed messages catches up without rereading the list. It reads
// the whole list again only when the change log no longer reaches back to its last read (10
// minutes). It blocks; the caller owns the goroutine.
func (c *Client) WatchBans(ctx context.Context, w BanWatch) {
	sub := newBanSubscription(c.flushRDB, BansChannel(c.cfg.Prefix), c.cfg.FlushTimeout)
	go sub.run(ctx)
	defer sub.close()
	t := time.NewTicker(w.Refresh)
	defer t.Stop()
	var cur BanCursor // Since 0: a full load is due
	fail := func(err error) {
		if ctx.Err() == nil && w.OnError != nil {
			w.OnError(err)
		}
	}
	full := func() {
		var all []BanEvent
		cursor, start := "0", int64(0)
		for first := true; first || cursor != "0"; first = false {
			page, next, now, err := c.ScanBans(ctx, cursor, w.Page)
			if err != nil {
				fail(err)
				return
			}
			if first {
				start = now
			}
			all = append(all, page...)
			cursor = next
		}
		w.OnLoad(all)
		cur = BanCursor{Since: start}
		if w.OnTotal != nil {
			w.OnTotal(int64(len(all)))
		}
	}
	changes := func() {
		if cur.Since == 0 {
			full()
			return
		}
		for {
			ch, err := c.BanChangesSince(ctx, cur, w.Page)
			if err != nil {
				fail(err)
				return
			}
			if ch.Reload { // the log no longer reaches back to our last read
				cur = BanCursor{}
				full()
				return
			}
			for _, ev := range ch.Events {
				w.OnEvent(ev)
			}
			cur = ch.Next
			if w.OnTotal != nil {
				w.OnTotal(ch.Total)
			}
			if !ch.More {
				return
			}
		}
	}
	sweep := "0"
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			changes()
			if w.Sweep > 0 && cur.Since != 0 {
				_, next, _, err := c.ScanBans(ctx, sweep, w.Sweep)
				if err != nil {
					fail(err)
					continue
				}
				sweep = next
			}
		case m := <-sub.out:
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					changes() // a full load the first time, or when the log no longer reaches back
				}
			case *redis.Message:
				ev, err := ParseBanMessage(m.Payload)
				if err != nil {
					fail(err)
					continue
				}
				w.OnEvent(ev)
			}
		}
	}
}
