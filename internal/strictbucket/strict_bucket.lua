-- strict_bucket.lua: a strict central token bucket, one call per decision (the "central" peer).
--
-- KEYS[1]  the bucket: a hash {t = tokens in micro-tokens, u = time of the last refill in µs of Redis TIME}
-- ARGV[1]  rate, tokens per second (a finite number in (0, 1e9])
-- ARGV[2]  burst, the bucket capacity in tokens (an integer in [1, 1e9])
-- ARGV[3]  n, tokens to take (an integer in [1, burst])
-- ARGV[4]  optional: the time in µs instead of Redis TIME (the fleet simulator's virtual time)
-- Reply: {allowed (1 or 0), remaining tokens (floor), retry-after in µs (0 when allowed)}
--
-- Integers only: micro-tokens and microseconds stay below 2^53, so no float reaches a reply or a
-- tostring. A missing bucket is full. A denial writes nothing (the refill is recomputed from the
-- stored time next call, with the same result). The key expires once it would be full again (a
-- minute later under a time override).

local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
if rate == nil or rate ~= rate or rate <= 0 or rate > 1e9 then
  return redis.error_reply('ERR strict_bucket: bad rate')
end
if burst == nil or burst < 1 or burst > 1e9 or burst ~= math.floor(burst) then
  return redis.error_reply('ERR strict_bucket: bad burst')
end
if n == nil or n < 1 or n > burst or n ~= math.floor(n) then
  return redis.error_reply('ERR strict_bucket: bad n')
end

local now = tonumber(ARGV[4])
if ARGV[4] ~= nil and (now == nil or now ~= now or now < 1 or now > 1e17) then
  return redis.error_reply('ERR strict_bucket: bad time')
end
-- TIME is called under a time override too: a central bucket in production reads Redis's clock on
-- every call, and the fleet simulator, which passes its virtual time here, compares this script's
-- Redis CPU with hybridrate's scripts, which read TIME on every call as well (for their TTLs).
local t = redis.call('TIME')
if now == nil then
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cap = burst * 1000000
local h = redis.call('HMGET', KEYS[1], 't', 'u')
local tokens = tonumber(h[1])
local ts = tonumber(h[2])
if tokens == nil or ts == nil then
  tokens = cap
  ts = now
end
if now > ts then
  -- µs × tokens/s = micro-tokens.
  tokens = math.min(cap, tokens + math.floor((now - ts) * rate))
  ts = now
end

local need = n * 1000000
if tokens < need then
  return {0, math.floor(tokens / 1000000), math.ceil((need - tokens) / rate)}
end
tokens = tokens - need
redis.call('HSET', KEYS[1], 't', string.format('%d', tokens), 'u', string.format('%d', ts))
-- Under a time override (the fleet simulator's virtual time, which may run slower than Redis's own
-- clock), the key outlives a slow run by a minute: expiring early would refill it.
local ttl = math.ceil((cap - tokens) / rate / 1000) + 1000
if ARGV[4] ~= nil then ttl = ttl + 60000 end
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, math.floor(tokens / 1000000), 0}
