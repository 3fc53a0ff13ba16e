#!lua
-- concurrency.lua (package concurrency, key layout v1): the in-flight leases of one key.
--
-- KEYS[1]  the key's lease set: a sorted set of lease id -> expiry, in µs of Redis TIME. The key
--          expires no earlier than its last lease, and Redis deletes it when its last lease is removed.
-- ARGV[1]  operation: "a" acquire, "r" release, "e" extend, "n" count
-- ARGV[2]  lease id, 1 to 64 bytes ("a", "r", "e"; ignored by "n")
-- ARGV[3]  limit, an integer from 1 to 1048576 ("a"; ignored otherwise)
-- ARGV[4]  lease time to live in ms, an integer from 1 to 86400000 ("a", "e"; ignored otherwise)
-- Every call first removes the leases whose expiry has passed (expiry <= now): a holder that died
-- gives its slots back once its leases' TTL has run out, and never before.
-- Reply: 3 integers {status, in_flight, wait_ms}; in_flight is the number of unexpired leases of the
-- key after the call.
--   "a": status 1: the lease is held, with expiry now + ttl. A lease id already held is not counted
--        twice (a retried call is a no-op but for the new expiry). status 0: the key already holds
--        `limit` leases; wait_ms is then the time until the earliest lease expires (an upper bound on
--        the wait, if no holder releases), else 0.
--   "r": status 1: the lease was held and is removed; 0: it was not held (released before, or expired).
--   "e": status 1: the lease is held with expiry now + ttl; 0: it was not held and is not re-created.
--   "n": status 1.
-- Errors: "ERR hybridrate: bad <arg>" for a bad argument (nothing changes); WRONGTYPE when the key
-- holds another type.

local rcall, tonum, smatch, sformat, ceil = redis.call, tonumber, string.match, string.format, math.ceil

local key = KEYS[1]
local op = ARGV[1]
local id = ARGV[2]

-- int returns ARGV[i] as an integer in [lo, hi], or nil: only decimal digits, no sign, no exponent.
local function int(i, lo, hi)
  local s = ARGV[i]
  if type(s) ~= 'string' or #s > 10 or not smatch(s, '^%d+$') then return nil end
  local v = tonum(s)
  if v < lo or v > hi then return nil end
  return v
end

if op ~= 'a' and op ~= 'r' and op ~= 'e' and op ~= 'n' then
  return redis.error_reply('ERR hybridrate: bad operation')
end
if op ~= 'n' and (type(id) ~= 'string' or #id < 1 or #id > 64) then
  return redis.error_reply('ERR hybridrate: bad lease id')
end
local limit, ttl
if op == 'a' then
  limit = int(3, 1, 1048576)
  if not limit then return redis.error_reply('ERR hybridrate: bad limit') end
end
if op == 'a' or op == 'e' then
  ttl = int(4, 1, 86400000)
  if not ttl then return redis.error_reply('ERR hybridrate: bad ttl') end
end

local t = rcall('TIME')
local now = tonum(t[1]) * 1000000 + tonum(t[2])
rcall('ZREMRANGEBYSCORE', key, '-inf', sformat('%d', now))

-- hold sets id's expiry and keeps the key alive at least as long as the lease.
local function hold()
  rcall('ZADD', key, sformat('%d', now + ttl * 1000), id)
  if rcall('PTTL', key) < ttl + 1 then rcall('PEXPIRE', key, ttl + 1) end
end

if op == 'a' then
  if not rcall('ZSCORE', key, id) then
    local n = rcall('ZCARD', key)
    if n >= limit then
      local first = rcall('ZRANGE', key, 0, 0, 'WITHSCORES')
      local wait = 0
      if first[2] then wait = ceil((tonum(first[2]) - now) / 1000) end
      return {0, n, wait}
    end
  end
  hold()
  return {1, rcall('ZCARD', key), 0}
elseif op == 'r' then
  local removed = rcall('ZREM', key, id)
  return {removed, rcall('ZCARD', key), 0}
elseif op == 'e' then
  if not rcall('ZSCORE', key, id) then return {0, rcall('ZCARD', key), 0} end
  hold()
  return {1, rcall('ZCARD', key), 0}
end
return {1, rcall('ZCARD', key), 0}
