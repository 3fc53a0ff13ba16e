package central

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// BanEvent is one change of the ban list as published to every node.
type BanEvent struct {
	Key    string
	Banned bool          // false: the key was unbanned
	TTL    time.Duration // remaining ban time when Banned
}

// Ban bans key on every node for d (1ms to about 31 years), measured by Redis TIME. The ban is
// written twice: into the key's bucket (field [BanField], bucketban.lua), where the scripts read it
// on every call, so that no node admits the key through Redis while it is banned, whatever its
// local copy of the ban list holds; and into the ban list, which every node's local copy follows.
func (c *Client) Ban(ctx context.Context, key string, d time.Duration) error {
	ms := d.Milliseconds()
	if ms < 1 || ms > 1e12 {
		return fmt.Errorf("central: ban duration %v out of range [1ms, 1e12ms]", d)
	}
	if err := c.bucketBan(ctx, key, "ban", ms); err != nil {
		return err
	}
	return c.banCall(ctx, "ban", key, ms)
}

// Unban lifts a ban on every node: from the ban list, then from the key's bucket.
func (c *Client) Unban(ctx context.Context, key string) error {
	if err := c.banCall(ctx, "unban", key, 0); err != nil {
		return err
	}
	return c.bucketBan(ctx, key, "unban", 0)
}

// bucketBan runs bucketban.lua's action ("ban" for ms, "unban") on key's bucket.
func (c *Client) bucketBan(ctx context.Context, key, action string, ms int64) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	if _, err := c.runner.Run(ctx, c.flushRDB, bucketBanScript, []string{BucketKey(c.cfg.Prefix, key)},
		action, strconv.FormatInt(ms, 10)); err != nil {
		return fmt.Errorf("central: %s %q in its bucket: %w", action, key, err)
	}
	return nil
}

func (c *Client) banCall(ctx context.Context, action, key string, ms int64) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	_, err := c.runner.Run(ctx, c.flushRDB, banScript, c.banKeys(),
		action, BansChannel(c.cfg.Prefix), key, strconv.FormatInt(ms, 10))
	if err != nil {
		return fmt.Errorf("central: %s %q: %w", action, key, err)
	}
	return nil
}

// Bans returns the bans in force, with their remaining time; it also removes expired entries. It
// reads the whole list in one script call, which blocks Redis for about a second per million bans:
// large lists are read page by page with [Client.ScanBans].
func (c *Client) Bans(ctx context.Context) ([]BanEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FlushTimeout)
	defer cancel()
	res, err := c.runner.Run(ctx, c.flushRDB, banScript, c.banKeys(), "list", BansChannel(c.cfg.Prefix), "", "0")
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
