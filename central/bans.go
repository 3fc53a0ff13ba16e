package central

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// BanEvent is one change of the ban list as published to every node.
type BanEvent struct {
	Key    string
	Banned bool          // false: the key was unbanned
	TTL    time.Duration // remaining ban time when Banned
}

// Ban bans key on every node for d (1ms to about 31 years), measured by Redis TIME.
func (c *Client) Ban(ctx context.Context, key string, d time.Duration) error {
	ms := d.Milliseconds()
	if ms < 1 || ms > 1e12 {
		return fmt.Errorf("central: ban duration %v out of range [1ms, 1e12ms]", d)
	}
	return c.banCall(ctx, "ban", key, ms)
}

// Unban lifts a ban on every node.
func (c *Client) Unban(ctx context.Context, key string) error {
	return c.banCall(ctx, "unban", key, 0)
}

func (c *Client) banCall(ctx context.Context, action, key string, ms int64) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	_, err := c.run(ctx, true, []string{BansKey(c.cfg.Prefix)},
		[]any{action, BansChannel(c.cfg.Prefix), key, strconv.FormatInt(ms, 10)})
	if err != nil {
		return fmt.Errorf("central: %s %q: %w", action, key, err)
	}
	return nil
}

// Bans returns the bans in force, with their remaining time; it also removes expired entries.
func (c *Client) Bans(ctx context.Context) ([]BanEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	res, err := c.run(ctx, true, []string{BansKey(c.cfg.Prefix)}, []any{"list", BansChannel(c.cfg.Prefix), "", "0"})
	if err != nil {
		return nil, fmt.Errorf("central: list bans: %w", err)
	}
	vals, ok := res.([]any)
	if !ok || len(vals)%2 != 0 {
		return nil, fmt.Errorf("%w: ban list %T", ErrBadReply, res)
	}
	out := make([]BanEvent, 0, len(vals)/2)
	for i := 0; i < len(vals); i += 2 {
		k, ok1 := vals[i].(string)
		ms, ok2 := vals[i+1].(int64)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%w: ban entry %T %T", ErrBadReply, vals[i], vals[i+1])
		}
		out = append(out, BanEvent{Key: k, Banned: true, TTL: time.Duration(ms) * time.Millisecond})
	}
	return out, nil
}

// ParseBanMessage decodes a message published by the ban script: "b <ms> <key>" or "u 0 <key>".
func ParseBanMessage(payload string) (BanEvent, error) {
	kind, rest, ok := strings.Cut(payload, " ")
	if !ok {
		return BanEvent{}, fmt.Errorf("central: bad ban message %q", payload)
	}
	num, key, ok := strings.Cut(rest, " ")
	if !ok {
		return BanEvent{}, fmt.Errorf("central: bad ban message %q", payload)
	}
	ms, err := strconv.ParseInt(num, 10, 64)
	if err != nil || ms < 0 || ms > 1e12 {
		return BanEvent{}, fmt.Errorf("central: bad ban message %q", payload)
	}
	switch kind {
	case "b":
		if ms == 0 {
			return BanEvent{}, fmt.Errorf("central: bad ban message %q", payload)
		}
		return BanEvent{Key: key, Banned: true, TTL: time.Duration(ms) * time.Millisecond}, nil
	case "u":
		return BanEvent{Key: key}, nil
	}
	return BanEvent{}, fmt.Errorf("central: bad ban message %q", payload)
}

// WatchBans delivers ban changes to fn until ctx ends. On every (re)subscription and every refresh
// interval it reloads the whole list and calls reload with it, so a node that missed messages while
// disconnected catches up. It blocks; the caller owns the goroutine. Errors go to onErr.
func (c *Client) WatchBans(ctx context.Context, refresh time.Duration, fn func(BanEvent), reload func([]BanEvent), onErr func(error)) {
	ps := c.cfg.Client.Subscribe(ctx, BansChannel(c.cfg.Prefix))
	defer ps.Close()
	t := time.NewTicker(refresh)
	defer t.Stop()
	doReload := func() {
		bans, err := c.Bans(ctx)
		if err != nil {
			if ctx.Err() == nil {
				onErr(err)
			}
			return
		}
		reload(bans)
	}
	msgs := ps.ChannelWithSubscriptions(redis.WithChannelSize(256), redis.WithChannelHealthCheckInterval(time.Second))
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			doReload()
		case m, ok := <-msgs:
			if !ok {
				return
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					doReload()
				}
			case *redis.Message:
				ev, err := ParseBanMessage(m.Payload)
				if err != nil {
					onErr(err)
					continue
				}
				fn(ev)
			}
		}
	}
}
