-- gcra.lua: the generic cell rate algorithm, an algorithm of strict.lua (spliced in by package central;
-- not a script on its own).
--
-- Model: the leaky bucket as a meter. Each unit of cost has an emission interval T = period / limit;
-- the key remembers only the theoretical arrival time (TAT) of the next unit. A request of cost n is
-- allowed when TAT + n·T − now ≤ τ, with the burst tolerance τ = period, so, like the token bucket
-- with the same limit and period, up to `limit` units pass at once and `limit` per period after that.
-- The answers are the token bucket's; the state is one short string instead of a hash.
--
-- KEYS: 1, a string "<ts> <d>": ts is the time of the last update in µs (an integer; a clock that
-- went back never moves it back) and d = TAT − ts, in µs (fractional, 17 significant digits). Keeping
-- the TAT as an offset from ts keeps its fraction exact: an absolute µs TAT near 1.8e15 would have a
-- resolution of only 0.25 µs, and the rounding would drift by up to that much per request.
-- TTL: d, the time until TAT (a missing key means TAT ≤ now, a full allowance), refreshed on every write.
-- wait_us when denied: TAT + n·T − τ − now; reset_us: TAT − now.

A.gcra = {nkeys = 1}

function A.gcra.load(r)
  local v = redis.call('GET', KEYS[r.k])
  local ts, d = nil, nil
  if v then
    local a, b = string.match(v, '^(%S+) (%S+)$')
    ts, d = tonumber(a), tonumber(b)
  end
  if ts == nil or ts ~= ts or d == nil or d ~= d then
    ts, d = r.now, 0
  end
  if r.now > ts then
    d = d - (r.now - ts)
    ts = r.now
  end
  if d < 0 then d = 0 end
  r.ts, r.d = ts, d
  r.need = d + r.n * r.period / r.limit -- TAT − ts after taking n
end

function A.gcra.check(r)
  local over = r.need - r.period
  if over <= tol(r.period) then return true, 0 end
  return false, ceil_us(over + r.ts - r.now, r.period)
end

function A.gcra.take(r)
  r.d = r.need
  local key = KEYS[r.k]
  redis.call('SET', key, string.format('%.17g %.17g', r.ts, r.d), 'PX', ttl_ms(r.d + r.ts - r.now))
end

function A.gcra.view(r)
  local reset = 0
  if r.d > tol(r.period) then reset = ceil_us(r.d + r.ts - r.now, r.period) end
  return math.floor((r.period - r.d + tol(r.period)) * r.limit / r.period), reset
end
