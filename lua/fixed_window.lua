-- fixed_window.lua: the fixed window counter, an algorithm of strict.lua (spliced in by package central;
-- not a script on its own).
--
-- Model: time is cut into windows of `period` µs aligned to the Unix epoch (a window starts when
-- Redis TIME is a multiple of the period); each window admits up to `limit` units, counted with
-- HINCRBY. Cheapest of all, but a burst at the end of one window and another at the start of the next
-- can admit 2·limit within a short time.
--
-- KEYS: 1, a hash
--   w  start of the counted window, µs
--   c  units admitted in that window
-- The window start is stored next to the count (rather than relying on the key expiring at the window
-- end) because expiry has ms resolution and windows have µs resolution, and so that a count can never
-- be carried into the next window. A clock that went back into an earlier window keeps counting in the
-- stored, later window.
-- TTL: until the end of the window (then the key means nothing), set when the window's count starts.
-- wait_us when denied: until the next window; reset_us: until the end of the window.

A.fw = {nkeys = 1}

function A.fw.load(r)
  local start = r.now - math.fmod(r.now, r.period)
  local h = redis.call('HMGET', KEYS[r.k], 'w', 'c')
  local w, c = tonumber(h[1]), tonumber(h[2])
  r.fresh = true
  r.c = 0
  if w ~= nil and c ~= nil and w == w and c == c and w >= start then
    start, r.c, r.fresh = w, c, false
  end
  r.start = start
end

function A.fw.check(r)
  if r.c + r.n <= r.limit then return true, 0 end
  return false, r.start + r.period - r.now
end

function A.fw.take(r)
  local key = KEYS[r.k]
  if r.fresh then
    redis.call('HSET', key, 'w', r.start, 'c', r.n)
    ttl(key, r.start + r.period - r.now)
  else
    redis.call('HINCRBY', key, 'c', r.n)
  end
  r.c = r.c + r.n
end

function A.fw.view(r)
  local reset = 0
  if r.c > 0 then reset = r.start + r.period - r.now end
  return r.limit - r.c, reset
end

-- uw, the upstream window: envoyproxy/ratelimit's fixed window, with the state, windows and view of fw.
-- Every hit counts, admitted or refused (upstream's INCRBY), so a refused request still uses up the
-- window; a check of n = 0 reads the count (over when the count is already above the limit) and writes
-- nothing; n may exceed the limit (the request is over). The driver takes uw's n even when the check
-- or another rule of the call refuses (counts_refused).

A.uw = {nkeys = 1, counts_refused = true}
A.uw.load = A.fw.load
A.uw.check = A.fw.check
A.uw.view = A.fw.view

function A.uw.take(r)
  if r.n > 0 then A.fw.take(r) end
end
