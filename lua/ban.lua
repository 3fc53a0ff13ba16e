#!lua
-- ban.lua: keep the hard-deny list and tell every node about changes.
--
-- KEYS[1]  the bans hash: field = limiter key, value = ban deadline in ms of Redis TIME
-- ARGV[1]  action: "ban", "unban" or "list"
-- ARGV[2]  channel to PUBLISH changes on ("ban" and "unban")
-- ARGV[3]  limiter key ("ban" and "unban")
-- ARGV[4]  ban duration in ms, 1..1e12 ("ban")
-- Published messages: "b <remaining_ms> <key>" and "u 0 <key>" (the key is everything after the second space).
-- Reply: "ban"/"unban": 1. "list": flat {key, remaining_ms, ...} of bans still in force; expired entries are removed.
-- The hash expires with its longest ban.

local bans = KEYS[1]
local action = ARGV[1]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if action == 'ban' then
  local ms = tonumber(ARGV[4])
  if ms == nil or ms ~= ms or ms < 1 or ms > 1e12 or ms ~= math.floor(ms) then
    return redis.error_reply('ERR hybridrate: bad ban duration')
  end
  redis.call('HSET', bans, ARGV[3], now_ms + ms)
  if redis.call('PTTL', bans) < ms then
    redis.call('PEXPIRE', bans, ms + 1000)
  end
  redis.call('PUBLISH', ARGV[2], string.format('b %d ', ms) .. ARGV[3])
  return 1
elseif action == 'unban' then
  redis.call('HDEL', bans, ARGV[3])
  redis.call('PUBLISH', ARGV[2], 'u 0 ' .. ARGV[3])
  return 1
elseif action == 'list' then
  local all = redis.call('HGETALL', bans)
  local out = {}
  for i = 1, #all, 2 do
    local until_ms = tonumber(all[i + 1])
    if until_ms == nil or until_ms <= now_ms then
      redis.call('HDEL', bans, all[i])
    else
      out[#out + 1] = all[i]
      out[#out + 1] = until_ms - now_ms
    end
  end
  return out
end
return redis.error_reply('ERR hybridrate: bad ban action')
