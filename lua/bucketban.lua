#!lua
-- bucketban.lua (key layout v5): keep a key's ban in its bucket, where reconcile.lua and take.lua read
-- it in the same HMGET as the bucket: the first call for a key sees its ban whatever a node's local
-- copy of the ban list holds (its cap), and in a Redis Cluster the ban is in the bucket's slot. The
-- ban list (ban.lua) keeps the same bans for the nodes' local copies; package central writes both.
--
-- KEYS[1]  the bucket key
-- ARGV[1]  ban duration in ms, 1..1e12; "0" lifts the ban
-- The field "ban" holds the deadline in ms of Redis TIME (decimal). The key lives at least as long as
-- the ban (and a second), so that the ban does not expire with an idle bucket; reconcile.lua keeps it
-- that long while it writes. A ban with no bucket yet is a hash with only this field: the scripts
-- read it as a full bucket, banned.
-- Reply: 1. Errors: "ERR hybridrate: bad ban duration".
local ms = tonumber(ARGV[1])
if ms == nil or ms ~= ms or ms < 0 or ms > 1e12 or ms ~= math.floor(ms) then
  return redis.error_reply('ERR hybridrate: bad ban duration')
end
if ms == 0 then
  redis.call('HDEL', KEYS[1], 'ban')
  return 1
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'ban', string.format('%d', now_ms + ms))
if redis.call('PTTL', KEYS[1]) < ms + 1000 then -- -1: no TTL yet (a new key)
  redis.call('PEXPIRE', KEYS[1], ms + 1000)
end
return 1
