-- peek.lua (key layout v6): read one global token bucket, refilled to now, without changing it.
--
-- KEYS[1]  bucket key (reconcile.lua documents its fields; only "b" is read)
-- ARGV[1]  rate (tokens/s), ARGV[2] burst, ARGV[3] time override in µs ("0" = use Redis TIME; tests only)
-- Reply: 3 integers: 1 when the bucket exists, else 0 (a missing or unreadable bucket is full, as
-- reconcile.lua would create it); the tokens in micro-tokens (floor; negative: debt) refilled to
-- now; the time to a full bucket in µs.
-- Errors: "ERR hybridrate: bad <arg>".
local rate, burst, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not (rate and rate >= 1e-9 and rate <= 1e9) then
  return redis.error_reply('ERR hybridrate: bad rate')
end
if not (burst and burst >= 1 and burst <= 1e9 and burst % 1 == 0) then
  return redis.error_reply('ERR hybridrate: bad burst')
end
if not (now and now >= 0 and now <= 7e16) then
  return redis.error_reply('ERR hybridrate: bad time override')
end
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local burst_u = burst * 1000000
local b = redis.call('HGET', KEYS[1], 'b')
if not b then return { 0, burst_u, 0 } end
local tokens, ts
local st = rawget(_G, 'struct') -- as reconcile.lua: packed where Redis has struct, else text
if st ~= nil then
  if #b ~= 37 then return { 0, burst_u, 0 } end
  tokens, ts = st.unpack('<i7I7', b)
else
  local t, s = string.match(b, '^(%-?%d+):(%x+):') -- t decimal, s hexadecimal
  if t == nil then return { 0, burst_u, 0 } end
  tokens, ts = tonumber(t), tonumber(s, 16)
end
if now > ts and tokens < burst_u then tokens = math.min(tokens + (now - ts) * rate, burst_u) end
if tokens > burst_u then tokens = burst_u end -- a burst lowered since the last write (reconcile.lua)
tokens = math.floor(tokens)
local full = math.ceil((burst_u - tokens) / rate)
if full > 1e15 then full = 1e15 end
if full < 0 then full = 0 end
return { 1, tokens, full }
