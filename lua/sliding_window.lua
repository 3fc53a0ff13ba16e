-- sliding_window.lua: the sliding window counter (Cloudflare style), an algorithm of strict.lua (spliced
-- in by package central; not a script on its own).
--
-- Model: epoch-aligned windows of `period` µs as in fixed_window.lua, but a request is judged on an
-- estimate of the last `period`: the previous window's count weighted by the part of it still inside
-- the sliding period, plus the current window's count:
--   estimate = prev · (period − elapsed) / period + cur,   allowed when estimate + n ≤ limit
-- where elapsed is the time since the current window started. This smooths the fixed window's
-- boundary burst at the cost of one more number per key; the estimate assumes the previous window's
-- requests were spread evenly.
--
-- KEYS: 1, a hash
--   w  start of the current window, µs
--   c  units admitted in it
--   p  units admitted in the window before it
-- A clock that went back into an earlier window keeps counting in the stored, later window.
-- TTL: until the end of the next window (the current count still weighs on it), refreshed on writes.
-- wait_us when denied: the earliest time at which the estimate would leave room for n, assuming no
-- other traffic (within this window when cur + n ≤ limit, else in the next one, where cur becomes prev);
-- reset_us: until the estimate is 0 again.

A.sw = {nkeys = 1}

function A.sw.load(r)
  local P = r.period
  local start = r.now - math.fmod(r.now, P)
  local h = redis.call('HMGET', KEYS[r.k], 'w', 'c', 'p')
  local w, c, p = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
  if w == nil or c == nil or p == nil or w ~= w or c ~= c or p ~= p or w < start - P then
    c, p = 0, 0
  elseif w == start - P then
    -- Two statements, not "c, p = 0, c": gopher-lua (miniredis) assigns left to right and would lose c.
    p = c
    c = 0
  elseif w > start then
    start = w -- the clock went back: stay in the stored window
  end
  r.start, r.c, r.p = start, c, p
  r.at = math.max(r.now, start) -- the time the estimate is made at
end

-- sw_estimate is prev's weighted part plus cur, at the load time.
local function sw_estimate(r)
  return r.p * (r.period - (r.at - r.start)) / r.period + r.c
end

function A.sw.check(r)
  local P, L, n = r.period, r.limit, r.n
  local left = r.start + P - r.at -- time left in the current window
  if r.c + n <= L then
    -- estimate + n ≤ L  ⟺  the weighted part drops to L − c − n, which takes `wait`
    if r.p == 0 then return true, 0 end
    local wait = left - (L - r.c - n) * P / r.p
    if wait <= tol(P) then return true, 0 end
    return false, ceil_us(wait + r.at - r.now, P)
  end
  -- Not in this window: in the next one cur becomes prev (c > 0 here, since n ≤ L).
  local into = P - (L - n) * P / r.c
  if into < 0 then into = 0 end
  return false, ceil_us(left + into + r.at - r.now, P)
end

function A.sw.take(r)
  local key = KEYS[r.k]
  r.c = r.c + r.n
  redis.call('HSET', key, 'w', r.start, 'c', r.c, 'p', r.p)
  ttl(key, r.start + 2 * r.period - r.now)
end

function A.sw.view(r)
  local reset = 0
  if r.c > 0 then reset = r.start + 2 * r.period - r.now
  elseif r.p > 0 then reset = r.start + r.period - r.now
  end
  return math.floor(r.limit - sw_estimate(r) + 1e-9), reset
end
