#!lua
-- bucketban.lua (key layout v6): keep a key's ban in its bucket, where reconcile.lua and take.lua read
-- it in the same HMGET as the bucket: the first call for a key sees its ban whatever a node's local
-- copy of the ban list holds (its cap), and in a Redis Cluster the ban is in the bucket's slot. The
-- ban list (ban.lua) keeps the same bans for the nodes' local copies; package central writes both.
--
-- KEYS[1]  the bucket key
-- ARGV[1]  action: "ban" (ARGV[2]: the duration in ms, 1..1e12), "unban", or "reset" (delete the
--          bucket and every node's record on it, but keep its ban)
-- The field "ban" holds the deadline in ms of Redis TIME (decimal). The key lives at least as long as
-- the ban (and a second), so that the ban does not expire with an idle bucket; reconcile.lua keeps it
-- that long while it writes. A ban with no bucket yet is a hash with only this field: the scripts
-- read it as a full bucket, banned.
-- Reply: 1 ("ban", "unban"); "reset": 1 when there was a bucket (anything but the ban), else 0.
-- Errors: "ERR hybridrate: bad ban duration", "ERR hybridrate: bad action".
local key, action = KEYS[1], ARGV[1]
if action == 'unban' then
  redis.call('HDEL', key, 'ban')
  return 1
elseif action == 'reset' then
  local ban = redis.call('HGET', key, 'ban')
  local n = redis.call('HLEN', key)
  if ban then n = n - 1 end
  if n == 0 then return 0 end
  local pttl = redis.call('PTTL', key)
  redis.call('DEL', key)
  if ban then
    redis.call('HSET', key, 'ban', ban)
    if pttl > 0 then redis.call('PEXPIRE', key, pttl) end
  end
  return 1
elseif action ~= 'ban' then
  return redis.error_reply('ERR hybridrate: bad action')
end
local ms = tonumber(ARGV[2])
if ms == nil or ms ~= ms or ms < 1 or ms > 1e12 or ms ~= math.floor(ms) then
  return redis.error_reply('ERR hybridrate: bad ban duration')
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', key, 'ban', string.format('%d', now_ms + ms))
if redis.call('PTTL', key) < ms + 1000 then -- -1: no TTL yet (a new key)
  redis.call('PEXPIRE', key, ms + 1000)
end
return 1
