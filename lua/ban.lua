#!lua
-- ban.lua: keep the hard-deny list and its change log, and tell every node about changes.
--
-- KEYS[1]  the bans hash: field = limiter key, value = ban deadline in ms of Redis TIME
-- KEYS[2]  the change log, a sorted set: member = limiter key, score = ms (Redis TIME) of its latest
--          ban or unban; entries older than the horizon (600000 ms) are pruned. Same hash tag as KEYS[1].
-- ARGV[1]  action: "ban", "unban", "list", "changes", "scan" or "check"
-- ARGV[2]  channel to PUBLISH changes on ("ban" and "unban")
-- ARGV[3]  limiter key ("ban", "unban"); since, in ms ("changes"); HSCAN cursor ("scan")
-- ARGV[4]  ban duration in ms, 1..1e12 ("ban"); page size, 1..100000 ("changes", "scan")
-- ARGV[5]  changes to skip at score since, from a previous page ("changes")
-- ARGV[5..] limiter keys ("check")
-- Published messages: "b <remaining_ms> <key>" and "u 0 <key>" (the key is everything after the second space).
-- Replies:
--   "ban"/"unban": 1.
--   "list": flat {key, remaining_ms, ...} of bans still in force; expired entries are removed (one
--           HGETALL: O(bans), kept for small lists and compatibility).
--   "changes": {now_ms, reload, total, next_since, more, next_skip, key, remaining_ms, ...}: the keys
--           whose ban changed at or after since (less the first skip of score since), with their
--           remaining time (0: unbanned or expired), at most a page; reload = 1 (and no keys) when
--           since is older than the log keeps; total = entries in the bans hash; next_since and
--           next_skip = since and skip for the next call; more = 1 when a page is waiting. Members of
--           equal score are ordered by name, so skipping by count resumes where the page ended.
--   "scan": {next_cursor, now_ms, key, remaining_ms, ...}: one HSCAN page of bans in force; expired
--           entries met are removed.
--   "check": {remaining_ms, ...} for each key of ARGV[5..] (0: not banned).
-- Both keys expire with the longest ban (the log at least one horizon after its latest change).

local bans = KEYS[1]
local log = KEYS[2]
local action = ARGV[1]
local horizon = 600000
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function logged(key)
  redis.call('ZADD', log, now_ms, key)
  redis.call('ZREMRANGEBYSCORE', log, '-inf', string.format('(%d', now_ms - horizon))
  local ttl = math.max(redis.call('PTTL', bans), 0) + horizon
  if redis.call('PTTL', log) < ttl then
    redis.call('PEXPIRE', log, ttl)
  end
end

-- in_force appends to out the key and remaining ms of each ban of kv (flat {key, deadline_ms, ...}
-- from HGETALL or HSCAN of the bans hash) still in force, removes the expired ones from the hash,
-- and returns out.
local function in_force(kv, out)
  for i = 1, #kv, 2 do
    local until_ms = tonumber(kv[i + 1])
    if until_ms == nil or until_ms <= now_ms then
      redis.call('HDEL', bans, kv[i])
    else
      out[#out + 1] = kv[i]
      out[#out + 1] = until_ms - now_ms
    end
  end
  return out
end

local function page_size(s)
  local n = tonumber(s)
  if n == nil or n ~= n or n < 1 or n > 100000 or n ~= math.floor(n) then
    return nil
  end
  return n
end

if action == 'ban' then
  local ms = tonumber(ARGV[4])
  if ms == nil or ms ~= ms or ms < 1 or ms > 1e12 or ms ~= math.floor(ms) then
    return redis.error_reply('ERR hybridrate: bad ban duration')
  end
  redis.call('HSET', bans, ARGV[3], now_ms + ms)
  if redis.call('PTTL', bans) < ms then
    redis.call('PEXPIRE', bans, ms + 1000)
  end
  logged(ARGV[3])
  redis.call('PUBLISH', ARGV[2], string.format('b %d ', ms) .. ARGV[3])
  return 1
elseif action == 'unban' then
  redis.call('HDEL', bans, ARGV[3])
  logged(ARGV[3])
  redis.call('PUBLISH', ARGV[2], 'u 0 ' .. ARGV[3])
  return 1
elseif action == 'list' then
  return in_force(redis.call('HGETALL', bans), {})
elseif action == 'changes' then
  local since = tonumber(ARGV[3])
  local n = page_size(ARGV[4])
  if since == nil or since ~= since or since ~= math.floor(since) or n == nil then
    return redis.error_reply('ERR hybridrate: bad changes request')
  end
  local total = redis.call('HLEN', bans)
  if since < now_ms - horizon then
    return {now_ms, 1, total, now_ms, 0, 0}
  end
  local skip = tonumber(ARGV[5])
  if skip == nil or skip ~= skip or skip < 0 or skip ~= math.floor(skip) then
    return redis.error_reply('ERR hybridrate: bad changes request')
  end
  local items = redis.call('ZRANGEBYSCORE', log, since, '+inf', 'WITHSCORES', 'LIMIT', skip, n)
  local more = 0
  local next_since = now_ms
  local next_skip = 0
  if #items / 2 == n then
    -- Resume after the last item: at its score, skip the items of that score already returned.
    more = 1
    next_since = tonumber(items[#items])
    for i = #items, 2, -2 do
      if tonumber(items[i]) ~= next_since then
        break
      end
      next_skip = next_skip + 1
    end
    if next_since == since then
      next_skip = next_skip + skip
    end
  end
  local out = {now_ms, 0, total, next_since, more, next_skip}
  for i = 1, #items, 2 do
    local until_ms = tonumber(redis.call('HGET', bans, items[i]))
    local rem = 0
    if until_ms ~= nil and until_ms > now_ms then
      rem = until_ms - now_ms
    end
    out[#out + 1] = items[i]
    out[#out + 1] = rem
  end
  return out
elseif action == 'scan' then
  local n = page_size(ARGV[4])
  if n == nil then
    return redis.error_reply('ERR hybridrate: bad scan request')
  end
  local r = redis.call('HSCAN', bans, ARGV[3], 'COUNT', n)
  return in_force(r[2], {r[1], now_ms})
elseif action == 'check' then
  local out = {}
  if #ARGV < 5 then
    return out
  end
  local vals = redis.call('HMGET', bans, unpack(ARGV, 5))
  for i = 1, #vals do
    local until_ms = tonumber(vals[i])
    if until_ms ~= nil and until_ms > now_ms then
      out[i] = until_ms - now_ms
    else
      out[i] = 0
    end
  end
  return out
end
return redis.error_reply('ERR hybridrate: bad ban action')
