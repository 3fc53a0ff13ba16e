#!lua
-- take.lua (key layout v6): a one-off take from a global token bucket of reconcile.lua's layout: n
-- tokens are taken and counted at once, or denied; nothing is leased and no node record is read or
-- written. It is for a node that sees a key too rarely to use a lease before it expires, on a fleet
-- larger than the key's burst (hybrid's direct rule, issue 21): such a decision costs Redis what a
-- central bucket's does. (reconcile.lua's inc 0 does the same, with all of that script's set-up.)
-- The bucket field and its TTL must stay exactly as reconcile.lua reads and writes them
-- (central's TestTakeMatchesReconcile checks the two against each other).
--
-- KEYS[1]  the bucket key
-- ARGV[1]  n, tokens to take (an integer from 1 to burst)
-- ARGV[2]  rate, tokens/s; ARGV[3] burst (as reconcile.lua bounds them)
-- ARGV[4]  lease advance ms; ARGV[5] active window ms (the bucket's TTL, as reconcile.lua sets it)
-- ARGV[6]  time override in µs ("0" = Redis TIME; the fleet simulator and tests)
-- ARGV[7]  the fleet's size (reconcile.lua's ARGV[7]; "0" = unknown)
-- The limit (ARGV[2], ARGV[3]) is not part of the key: as in reconcile.lua, the bucket is refilled
-- at this call's rate since its last write and clamped to this call's burst.
-- A key banned in the bucket's "ban" field (reconcile.lua) is denied with status 2 and the ban's
-- remaining time as the retry; nothing is written.
-- Reply: 6 integers, as reconcile.lua's per key: status (1 taken, 0 denied, 2 banned), 0, tokens in
-- micro-tokens after the call, the key's demand in milli-tokens/s, retry µs (denied: until n could
-- be taken), time to a full bucket µs.
local floor, ceil, mmin, mmax = math.floor, math.ceil, math.min, math.max
local tonum = tonumber
local n, rate, burst = tonum(ARGV[1]), tonum(ARGV[2]), tonum(ARGV[3])
local advance_ms, window_ms, now, fleet_n = tonum(ARGV[4]), tonum(ARGV[5]), tonum(ARGV[6]), tonum(ARGV[7])
if not (rate ~= nil and rate >= 1e-9 and rate <= 1e9) then return redis.error_reply('ERR hybridrate: bad rate') end
if not (burst ~= nil and burst >= 1 and burst <= 1e9 and burst % 1 == 0) then
  return redis.error_reply('ERR hybridrate: bad burst')
end
if not (n ~= nil and n >= 1 and n <= burst and n % 1 == 0) then return redis.error_reply('ERR hybridrate: bad n') end
if not (advance_ms ~= nil and advance_ms >= 0 and advance_ms <= 1e9) then
  return redis.error_reply('ERR hybridrate: bad lease advance')
end
if not (window_ms ~= nil and window_ms >= 1 and window_ms <= 1e10) then
  return redis.error_reply('ERR hybridrate: bad active window')
end
if not (now ~= nil and now >= 0 and now <= 7e16) then return redis.error_reply('ERR hybridrate: bad time override') end
if not (fleet_n ~= nil and fleet_n >= 0 and fleet_n <= 1e9) then return redis.error_reply('ERR hybridrate: bad fleet size') end
-- The key's TTL is kept on Redis's own clock, which expires keys, whatever the decisions' clock
-- (as reconcile.lua's): it is refreshed when half of it has passed. (Until 2026-11-27 a call under
-- a time override refreshed it on every write, which cost the fleet simulator's one-off takes a
-- PEXPIRE per decision that they do not cost in production.)
local t = redis.call('TIME')
local ttl_ms = tonum(t[1]) * 1000 + floor(tonum(t[2]) / 1000)
if now == 0 then now = tonum(t[1]) * 1000000 + tonum(t[2]) end
local st = rawget(_G, 'struct')

local burst_u = burst * 1000000
local tokens, ts, consumed, w, next_scan, ttl_set
local h = redis.call('HMGET', KEYS[1], 'b', 'ban', 'o')
local b, ban = h[1], tonum(h[2])
if b then
  if st ~= nil then
    if #b == 37 then
      local wm, dnt
      tokens, ts, consumed, wm, dnt, ttl_set = st.unpack('<i7I7I7I5i5i6', b)
      w, next_scan = wm / 1000, ts + dnt
    end
  else
    local t1, t2, t3, t4, t5, t6 = string.match(b, '^(%-?%d+):(%x+):(%d+):(%x+):(%x+):(%x+)$')
    if t1 ~= nil then
      tokens, ts, consumed, w, next_scan, ttl_set = tonum(t1), tonum(t2, 16), tonum(t3), tonum(t4, 16) / 1000,
        tonum(t5, 16), tonum(t6, 16)
    end
  end
end
if tokens == nil then
  -- A new bucket (or an unreadable one): full, as reconcile.lua makes it; the next reconcile of the
  -- key scans its node records at once (there are none) and sets its own scan period.
  tokens, ts, consumed, w, next_scan, ttl_set = burst_u, now, 0, 0, now, -1
end
if now > ts then
  if tokens < burst_u then
    tokens = mmin(tokens + (now - ts) * rate, burst_u)
  end
  ts = now
end
-- A burst lowered since the bucket's last write (the limit is not part of the key): clamp.
if tokens > burst_u then tokens = burst_u end
-- The key's one-off demand (reconcile.lua's o field: an exponentially decayed rate, tokens/s, with a
-- time constant of ONEOFF_TAU µs, and its time): w counts only the nodes that lease the key.
local ONEOFF_TAU = 1000000
local ow = 0
if h[3] then
  local r, t
  if st ~= nil then
    if #h[3] == 16 then r, t = st.unpack('<dd', h[3]) end
  else
    local a, c = string.match(h[3], '^([%d.]+):(%x+)$')
    if a ~= nil then r, t = tonum(a), tonum(c, 16) end
  end
  if r ~= nil and r >= 0 and r <= 1e12 then
    ow = r
    if now > t then ow = r * math.exp((t - now) / ONEOFF_TAU) end
  end
end
-- The key's ban: a deadline on Redis TIME in ms (bucketban.lua), whatever the decisions' clock, as in
-- reconcile.lua.
if ban ~= nil then
  local now_ms = ttl_ms
  if ban > now_ms then
    return {2, 0, floor(tokens), floor((w + ow) * 1000), mmin((ban - now_ms) * 1000, 1e15),
      mmin(mmax(ceil((burst_u - tokens) / rate), 0), 1e15)}
  end
end
-- While the key's declared demand is under its rate, reconcile.lua lends nodes the refill of the
-- coming advance (the bucket may go down to -rate·advance); a one-off take may draw on the same
-- advance, on the same condition (fleet_n, and the declared demand w alone: see reconcile.lua), so
-- that it is not denied while the key is under its rate because leases hold the bucket below zero.
local adv_max = floor(rate * advance_ms / 1000)
local adv = 0
if fleet_n <= burst + adv_max and w < rate then adv = mmin(adv_max, floor(w * advance_ms / 1000)) end
if tokens + adv * 1000000 < n * 1000000 then
  -- A denial writes nothing: the refill is recomputed from the stored time next call.
  return {0, 0, floor(tokens), floor((w + ow) * 1000), mmin(ceil((n * 1000000 - adv * 1000000 - tokens) / rate), 1e15),
    mmin(mmax(ceil((burst_u - tokens) / rate), 0), 1e15)}
end
tokens = floor(tokens - n * 1000000)
consumed = consumed + n
local ttl = mmin(mmax(ceil(2000 * (burst + adv_max) / rate) + 1000, window_ms), 1e12)
local refresh = true
if ttl_set < 0 or ttl_ms - ttl_set > ttl / 2 or ttl_ms < ttl_set then
  ttl_set = ttl_ms
else
  refresh = false
end
-- The take counts in the key's one-off demand.
ow = ow + n * 1000000 / ONEOFF_TAU
local o
if st ~= nil then
  -- reconcile.lua's bucket(): w in milli-tokens/s, nt as its offset from s, each clamped to its width.
  local wm = mmin(mmax(floor(w * 1000 + 0.5), 0), 1099511627775)
  local dnt = mmin(mmax(next_scan - ts, -549755813887), 549755813887)
  b = st.pack('<i7I7I7I5i5i6', tokens, ts, consumed, wm, dnt, ttl_set)
  o = st.pack('<dd', ow, now)
else
  b = string.format('%d:%x:%d:%x:%x:%x', tokens, ts, consumed, w * 1000 + 0.5, next_scan, ttl_set)
  o = string.format('%.6f:%x', ow, now)
end
redis.call('HSET', KEYS[1], 'b', b, 'o', o)
if refresh then redis.call('PEXPIRE', KEYS[1], ttl) end
return {1, 0, tokens, floor((w + ow) * 1000), 0, mmin(mmax(ceil((burst_u - tokens) / rate), 0), 1e15)}
