-- token_bucket.lua: the strict token bucket, an algorithm of strict.lua (spliced in by package central;
-- not a script on its own).
--
-- Model: a bucket of `limit` tokens that refills continuously at limit/period tokens per µs, measured by
-- Redis TIME; a request takes n tokens when at least n are there. Bursts of up to `limit` pass at once.
-- The arithmetic is the core's bucket (reconcile.lua) with no node accounting and no debt.
--
-- KEYS: 1, a hash
--   tk  tokens after the last update (fractional, stored with 17 significant digits)
--   ts  time of the last update, µs (a clock that went back never moves it back)
-- TTL: the time until the bucket is full again (a missing key means a full bucket, so expiry loses
-- nothing), refreshed on every write.
-- wait_us when denied: ceil((n - tokens) · period / limit); reset_us: time until the bucket is full.

A.tb = {nkeys = 1}

function A.tb.load(r)
  local h = redis.call('HMGET', KEYS[r.k], 'tk', 'ts')
  local tokens, ts = tonumber(h[1]), tonumber(h[2])
  if tokens == nil or tokens ~= tokens or ts == nil or ts ~= ts then
    tokens, ts = r.limit, r.now
  end
  if r.now > ts then
    tokens = tokens + (r.now - ts) * r.limit / r.period
    ts = r.now
  end
  if tokens > r.limit then tokens = r.limit end
  r.tokens, r.ts = tokens, ts
end

-- deficit is how long, in µs from the bucket's time, until n tokens are there.
local function tb_deficit(r)
  return (r.n - r.tokens) * r.period / r.limit
end

function A.tb.check(r)
  local d = tb_deficit(r)
  if d <= tol(r.period) then return true, 0 end
  return false, ceil_us(d + r.ts - r.now, r.period)
end

function A.tb.take(r)
  r.tokens = r.tokens - r.n
  local key = KEYS[r.k]
  redis.call('HSET', key, 'tk', r.tokens, 'ts', r.ts)
  ttl(key, (r.limit - r.tokens) * r.period / r.limit + r.ts - r.now)
end

function A.tb.view(r)
  local full = (r.limit - r.tokens) * r.period / r.limit
  local reset = 0
  if full > tol(r.period) then reset = ceil_us(full + r.ts - r.now, r.period) end
  return math.floor(r.tokens + tol(r.period) * r.limit / r.period), reset
end
