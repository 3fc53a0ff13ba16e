#!lua
-- fleet.lua: the registry of live nodes (limiters) that share a key prefix, so that each node knows
-- how many nodes there are: what a node may grant itself without asking Redis (cold-start credit)
-- is that fleet-wide budget divided by the fleet, never a fixed amount per node
-- (docs/accuracy.md).
--
-- KEYS[1]  the registry: a sorted set of node ids scored by the time (ms) of their last heartbeat
-- ARGV[1]  "beat" (register or refresh this node, then count) or "leave" (remove it)
-- ARGV[2]  node id (1 to 64 bytes of [A-Za-z0-9_-])
-- ARGV[3]  how long (ms) a node counts after its last heartbeat, at least (1 to 1e9): 30 ms per
--          live node when that is longer
-- ARGV[4]  the time in µs instead of Redis TIME ("0": Redis TIME; the fleet simulator's virtual time)
-- Reply: the number of live nodes after the call.
local action, node = ARGV[1], ARGV[2]
local ttl = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if action ~= 'beat' and action ~= 'leave' then
  return redis.error_reply('ERR hybridrate: bad fleet action')
end
if node == nil or #node < 1 or #node > 64 or string.find(node, '[^%w_-]') then
  return redis.error_reply('ERR hybridrate: bad node id')
end
if ttl == nil or ttl ~= ttl or ttl < 1 or ttl > 1e9 then
  return redis.error_reply('ERR hybridrate: bad fleet ttl')
end
if now == nil or now ~= now or now < 0 or now > 1e17 then
  return redis.error_reply('ERR hybridrate: bad time override')
end
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local now_ms = math.floor(now / 1000)
if action == 'leave' then
  redis.call('ZREM', KEYS[1], node)
  return redis.call('ZCARD', KEYS[1])
end
-- Nodes beat every max(5 s, 10 ms per live node) (hybrid's fleet.go), so that a fleet's heartbeats
-- cost Redis about 100 calls a second at most whatever its size; a node counts for three of those
-- periods after its last heartbeat, and never less than ttl.
local card = redis.call('ZCARD', KEYS[1])
ttl = math.max(ttl, card * 30)
redis.call('ZADD', KEYS[1], now_ms, node)
-- Nodes gone for longer than that no longer count (a crashed process never says "leave").
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now_ms - ttl))
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return redis.call('ZCARD', KEYS[1])
