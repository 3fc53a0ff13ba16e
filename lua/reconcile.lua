#!lua
-- reconcile.lua (key layout v2): lease tokens of global token buckets to nodes, and apply what the
-- nodes consumed beyond their leases.
--
-- One call handles one or more buckets (all KEYS must share a cluster slot). Each bucket is a hash
-- of two kinds of fields (packed into strings: every field read or written costs Redis CPU):
--   b   "t:s:c:w:nt:x", the bucket:
--       t   tokens in the bucket, in micro-tokens (integer; negative down to -burst: debt)
--       s   time of the last refill, µs of Redis TIME
--       c   tokens admitted in total, as the nodes report them (accounting; never decreases)
--       w   the demand on the key, tokens/s: the sum of the demands the active nodes declared
--       nt  next time (µs) the node records are scanned: w recomputed, departed nodes pruned
--       x   time (ms) the key's TTL was last set; it is set again once half of it has passed
--   n:<node>  "inc:chg:used:demand:seen_ms", this node's record
--
-- The model. A node's lease is tokens taken from the bucket in advance: it may consume them without
-- asking. `chg` is the tokens charged to the node's incarnation in total (leases and debt); the node
-- reports `cum`, what it consumed (admitted, plus unused lease it wrote off when the lease expired).
-- Consumption beyond chg (a node's small overdraft credit, a failure policy's admissions) is charged
-- when reported, as debt. A lease is at most the node's demand-weighted share of the burst (the
-- shares of all nodes add up to at most one burst, half of it when the demand is high) and is used
-- for a limited time (the node writes off what is left when its lease life ends, on its own clock):
-- docs/accuracy.md bounds what leases held while the bucket refills can add to a burst.
--
-- Idempotency: every count a node sends is cumulative for its incarnation (cum, used), and a
-- lease request asks for the unused lease the node wants to hold after the call (want), not for an
-- amount: a call applied twice (a client retry after a timeout) or late charges nothing twice and
-- grants nothing twice. A node that forgot a key (evicted once all its consumption was counted)
-- comes back with a larger inc: `acked`/`uacked` (what it knows was charged and counted) seed the
-- new record. inc 0 is a one-off take by a node with no room for the key: n is taken and counted
-- at once, or denied.
--
-- KEYS[i]  bucket key
-- ARGV[1]  node id (no ':'), ARGV[2] prune age ms (a node's record is dropped this long after its
-- last call), ARGV[3] scan period ms, ARGV[4] active window ms (a node's demand counts in w this
-- long after its last call), ARGV[5] lease horizon ms (a lease is sized to last this long),
-- ARGV[6] time override in µs ("0" = use Redis TIME; tests only)
-- then 10 arguments per key, in KEYS order:
--   inc, cum, acked, used, uacked, demand (this node's demand, tokens/s), want (unused lease wanted
--   after the call), n (tokens the caller must have now, 0 for a background call), rate (tokens/s),
--   burst
-- Reply: 6 integers per key, in KEYS order:
--   status: 1 n covered (a lease of at least n is held, and n is counted), 0 n denied, -1 background
--           call done, -2 a late call from a replaced incarnation (nothing changed),
--           -3 this key failed (the second element is the error message; other keys are unaffected)
--   chg, tokens in micro-tokens (floor, after the call), the key's demand in milli-tokens/s,
--   retry µs (n denied: until n could be covered; a lease shorter than wanted while the key is over
--   its rate: when this node should ask again; else 0), time to a full bucket µs.
-- Errors for the whole call only for bad global arguments: "ERR hybridrate: bad <arg>".

-- Library functions as locals: a global lookup per call costs Redis CPU in a per-key loop.
local floor, ceil, mmin, mmax = math.floor, math.ceil, math.min, math.max
local smatch, sformat, sfind, ssub, tonum = string.match, string.format, string.find, string.sub, tonumber
local rcall = redis.call

local node = ARGV[1]
local prune_ms = tonum(ARGV[2])
local scan_ms = tonum(ARGV[3])
local window_ms = tonum(ARGV[4])
local horizon_ms = tonum(ARGV[5])
local now = tonum(ARGV[6])
if node == nil or node == '' or sfind(node, ':', 1, true) then
  return redis.error_reply('ERR hybridrate: bad node id')
end
if prune_ms == nil or prune_ms ~= prune_ms or prune_ms < 1 or prune_ms > 1e10 then
  return redis.error_reply('ERR hybridrate: bad prune age')
end
if scan_ms == nil or scan_ms ~= scan_ms or scan_ms < 1 or scan_ms > 1e10 then
  return redis.error_reply('ERR hybridrate: bad scan period')
end
if window_ms == nil or window_ms ~= window_ms or window_ms < 1 or window_ms > 1e10 then
  return redis.error_reply('ERR hybridrate: bad active window')
end
if horizon_ms == nil or horizon_ms ~= horizon_ms or horizon_ms < 1 or horizon_ms > 1e9 then
  return redis.error_reply('ERR hybridrate: bad lease horizon')
end
if now == nil or now ~= now or now < 0 or now > 1e17 then
  return redis.error_reply('ERR hybridrate: bad time override')
end
if now == 0 then
  local t = rcall('TIME')
  now = tonum(t[1]) * 1000000 + tonum(t[2])
end
local now_ms = floor(now / 1000)
local field = 'n:' .. node
local NG, NA = 6, 10
if #ARGV ~= NG + NA * #KEYS then
  return redis.error_reply('ERR hybridrate: want ' .. (NG + NA * #KEYS) .. ' arguments, got ' .. #ARGV)
end
local MAXI = 9007199254740991

-- clamp keeps a duration reply inside what an integer reply can carry (about 31 years in µs).
local function clamp(v)
  if v > 1e15 then return 1e15 end
  if v < 0 then return 0 end
  return v
end

-- parse reads a node record; nil when absent or malformed.
local function parse(s)
  if not s then return nil end
  local a, b, c, d, e = smatch(s, '^(%d+):(%d+):(%d+):([%d.]+):(%d+)$')
  if a == nil then return nil end
  return { inc = tonum(a), chg = tonum(b), used = tonum(c), d = tonum(d), seen = tonum(e) }
end

local function process(i, key)
  local b = NG + (i - 1) * NA
  -- Checked inline (no function calls): NaN fails every comparison, so "not (lo <= x and x <= hi)"
  -- rejects it; "x % 1 == 0" requires an integer.
  local inc, cum, acked = tonum(ARGV[b + 1]), tonum(ARGV[b + 2]), tonum(ARGV[b + 3])
  local used, uacked, demand = tonum(ARGV[b + 4]), tonum(ARGV[b + 5]), tonum(ARGV[b + 6])
  local want, n = tonum(ARGV[b + 7]), tonum(ARGV[b + 8])
  local rate, burst = tonum(ARGV[b + 9]), tonum(ARGV[b + 10])
  local bad = nil
  if not (inc and inc >= 0 and inc <= MAXI and inc % 1 == 0) then bad = 'inc'
  elseif not (cum and cum >= 0 and cum <= MAXI and cum % 1 == 0) then bad = 'cum'
  elseif not (acked and acked >= 0 and acked <= MAXI and acked % 1 == 0) then bad = 'acked'
  elseif not (used and used >= 0 and used <= cum and used % 1 == 0) then bad = 'used'
  elseif not (uacked and uacked >= 0 and uacked <= MAXI and uacked % 1 == 0) then bad = 'uacked'
  elseif not (demand and demand >= 0 and demand <= 1e9) then bad = 'demand'
  elseif not (want and want >= 0 and want <= 1e9 and want % 1 == 0) then bad = 'want'
  elseif not (rate and rate >= 1e-9 and rate <= 1e9) then bad = 'rate'
  elseif not (burst and burst >= 1 and burst <= 1e9 and burst % 1 == 0) then bad = 'burst'
  elseif not (n and n >= 0 and n <= burst and n % 1 == 0) then bad = 'n'
  end
  if bad then error('hybridrate: bad ' .. bad .. ' for key ' .. i, 0) end

  local h = rcall('HMGET', key, 'b', field)
  local burst_u = burst * 1000000
  local tokens, ts, consumed, w, next_scan, ttl_set
  if h[1] then
    local t1, t2, t3, t4, t5, t6 = smatch(h[1], '^(%-?%d+):(%d+):(%d+):([%d.]+):(%d+):(%-?%d+)$')
    tokens, ts, consumed, w = tonum(t1), tonum(t2), tonum(t3), tonum(t4)
    next_scan, ttl_set = tonum(t5), tonum(t6)
  end
  if tokens == nil then
    -- A new bucket (or an unreadable one): full.
    tokens, ts, consumed, w, next_scan, ttl_set = burst_u, now, 0, 0, now + scan_ms * 1000, -1
  end

  -- Refill by Redis time only (a clock that went backwards refills nothing).
  if now > ts then
    if tokens < burst_u then tokens = mmin(tokens + (now - ts) * rate, burst_u) end
    ts = now
  end
  local ttl = mmin(ceil(2000 * burst / rate) + 1000, 1e12)

  if inc == 0 then
    -- A take by a node without local state for the key (its key cap is full of keys with consumption
    -- not yet counted): n is taken and counted now, nothing is leased, no record is kept.
    local status, retry = 0, 0
    if tokens >= n * 1000000 then
      tokens = tokens - n * 1000000
      consumed = consumed + n
      status = 1
    else
      retry = clamp(ceil((n * 1000000 - tokens) / rate))
    end
    tokens = floor(tokens)
    rcall('HSET', key, 'b', sformat('%d:%d:%d:%.3f:%d:%d', tokens, ts, consumed, w, next_scan, now_ms))
    rcall('PEXPIRE', key, ttl)
    return { status, 0, tokens, floor(w * 1000), retry, clamp(ceil((burst_u - tokens) / rate)) }
  end

  local rec = parse(h[2])
  if rec ~= nil and rec.inc > inc then
    -- A late call from an incarnation the node has already replaced.
    return { -2, acked, floor(tokens), floor(w * 1000), 0, clamp(ceil((burst_u - tokens) / rate)) }
  end
  -- Demand: the node's declared demand replaces what it declared before (if that still counts).
  if rec ~= nil and rec.seen >= now_ms - window_ms then w = w - rec.d end
  if rec == nil or rec.inc < inc then
    rec = { inc = inc, chg = acked, used = uacked, d = 0, seen = now_ms }
  end
  rec.d = demand
  w = w + demand
  if w < demand then w = demand end

  -- Apply the report: admitted tokens to the accounting, consumption beyond the charge as debt.
  if used > rec.used then
    consumed = consumed + (used - rec.used)
    rec.used = used
  end
  if cum > rec.chg then
    tokens = tokens - (cum - rec.chg) * 1000000
    rec.chg = cum
  end

  -- Lease: bring this node's unused lease up to what it wants (at least n for a synchronous call),
  -- within its demand-weighted share of the burst, from whole tokens in the bucket.
  local status = -1
  local retry = 0
  local have = rec.chg - cum
  local target = mmax(want, n)
  local wv = mmax(w, demand)
  local granted = true
  if target > have then
    -- Each node's lease is at most its demand-weighted share of the burst. When the key's demand
    -- would take more than the burst within a lease's horizon while staying below the rate (the
    -- refill keeps up), leases come only from the upper half of the bucket: the lower half is a
    -- reserve for the node whose lease runs out first, so that nobody is denied while the key is
    -- under its limit.
    local share = target
    local reserve = 0
    if demand > 0 and wv > 0 then
      if wv * horizon_ms / 1000 > burst and wv < rate then reserve = floor(burst / 2) end
      share = mmax(floor(burst * demand / wv + 0.5), 1)
    end
    local g = mmin(target, mmax(share, n)) - have
    local avail = floor(tokens / 1000000)
    -- A synchronous call may use the reserve for its n.
    g = mmin(g, mmax(avail - reserve, n - have), avail)
    if g < 0 then g = 0 end
    if n > 0 and have + g < n then
      -- A synchronous call that cannot be covered takes nothing.
      g = 0
      granted = false
      status = 0
      retry = clamp(ceil(((n - have) * 1000000 - tokens) / rate))
    else
      local short = mmin(target, mmax(share, n)) - have - g
      if short > 0 and reserve == 0 then
        local frac = 1
        if demand > 0 and wv > 0 then frac = demand / wv end
        -- Ask again once this node's share of the refill covers half its share of the burst (at
        -- least a token), or the shortfall if smaller, and do so at about three times that pace:
        -- the nodes of a key over its limit collect the refill faster than it comes, so little of
        -- it waits in the bucket unclaimed, and a node is not told to wait longer than a few
        -- requests' worth.
        local need = mmin(short, mmax(1, ceil(share / 2)))
        retry = clamp(ceil(need * 350000 / (rate * frac)))
      end
    end
    tokens = tokens - g * 1000000
    rec.chg = rec.chg + g
  end
  if n > 0 and granted then
    -- The caller takes n from its lease at once: count them now. Its next call reports them as used;
    -- counts are cumulative (max), so they are not counted twice, and a replayed call neither.
    status = 1
    local u = mmax(rec.used, used + n)
    consumed = consumed + (u - rec.used)
    rec.used = u
  end
  if tokens < -burst_u then tokens = -burst_u end
  rec.seen = now_ms

  -- Now and then, recompute w from the nodes active within the window and drop the records of
  -- nodes gone for longer than the prune age.
  if now >= next_scan then
    local all = rcall('HGETALL', key)
    w = demand
    for j = 1, #all, 2 do
      local f = all[j]
      if ssub(f, 1, 2) == 'n:' and f ~= field then
        local r = parse(all[j + 1])
        if r == nil or r.seen < now_ms - prune_ms then
          rcall('HDEL', key, f)
        elseif r.seen >= now_ms - window_ms then
          w = w + r.d
        end
      end
    end
    next_scan = now + scan_ms * 1000
  end

  tokens = floor(tokens)
  -- Keep the key while a full refill takes (twice, plus a second), refreshed once half of it has
  -- passed (every write command costs a few µs of Redis CPU).
  local refresh = ttl_set < 0 or now_ms - ttl_set > ttl / 2 or now_ms < ttl_set
  if refresh then ttl_set = now_ms end
  rcall('HSET', key,
    'b', sformat('%d:%d:%d:%.3f:%d:%d', tokens, ts, consumed, w, next_scan, ttl_set),
    field, sformat('%d:%d:%d:%.3f:%d', rec.inc, rec.chg, rec.used, rec.d, rec.seen))
  if refresh then rcall('PEXPIRE', key, ttl) end
  return { status, rec.chg, tokens, floor(w * 1000), retry, clamp(ceil((burst_u - tokens) / rate)) }
end

local res = {}
for i = 1, #KEYS do
  local ok, r = pcall(process, i, KEYS[i])
  if not ok then
    local msg = r
    if type(msg) == 'table' then msg = msg.err or 'error' end
    r = { -3, tostring(msg), 0, 0, 0, 0 }
  end
  for j = 1, 6 do res[#res + 1] = r[j] end
end
return res
