#!lua
-- reconcile.lua (key layout v2): lease tokens of global token buckets to nodes, and apply what the
-- nodes consumed beyond their leases.
--
-- One call handles one or more buckets (all KEYS must share a cluster slot). Each bucket is a hash:
--   t   tokens in the bucket, in micro-tokens (integer; negative down to -burst: debt)
--   s   time of the last refill, µs of Redis TIME
--   c   tokens admitted in total, as the nodes report them (accounting; never decreases)
--   w   the sum of the demands (tokens/s) the active nodes declared
--   na  nodes active within the active window
--   nt  next time (µs) the records are recounted (w and na recomputed; departed nodes pruned)
--   x   time (ms) the key's TTL was last set; it is set again once half of it has passed
--   n:<node>  "inc:seq:cum:used:chg:demand:seen_ms", this node's record
--
-- The model. A node's lease is tokens taken from the bucket in advance: it may consume them without
-- asking. `chg` is the tokens charged to the node's incarnation in total (leases and debt); `cum` what
-- it reports consumed (admitted, plus unused lease it wrote off when the lease expired). Consumption
-- beyond chg (a node's small overdraft credit, a failure policy's admissions) is charged when
-- reported, as debt. A lease is at most the node's demand-weighted share of the burst (the shares of
-- all nodes add up to at most one burst) and is used for a limited time (the node writes off what is
-- left when its lease life ends, on its own clock): docs/accuracy.md bounds what leases held while
-- the bucket refills can add to a burst.
--
-- Idempotency: the node numbers its calls per incarnation (seq). A call whose seq is not newer than
-- the record's (a replay after a client retry, or a late call) changes nothing and returns the record.
-- A node that forgot a key (evicted once all its consumption was charged) comes back with a larger
-- inc: `acked`/`uacked` (what it knows was charged and counted) seed the new record. inc 0 is a
-- one-off take by a node with no room for the key: n is taken and counted at once, or denied.
--
-- KEYS[i]  bucket key
-- ARGV[1]  node id (no ':'), ARGV[2] lease life ms (records are kept at least this long),
-- ARGV[3]  active window ms, ARGV[4] prune age ms, ARGV[5] recount period ms,
-- ARGV[6]  time override in µs ("0" = use Redis TIME; tests only)
-- then 11 arguments per key, in KEYS order:
--   inc, seq, cum, acked, used, uacked, demand (tokens/s), want (unused lease wanted after the call),
--   n (tokens the caller must have now, 0 for a background call), rate (tokens/s), burst
-- Reply: 7 integers per key, in KEYS order:
--   status: 1 n covered (a lease of at least n is held), 0 n denied, -1 background call done,
--           -2 stale call (nothing changed; the record's values are returned),
--           -3 this key failed (the second element is the error message; other keys are unaffected)
--   seq (the record's), chg, tokens in micro-tokens (floor, after the call), active nodes,
--   retry µs (n denied: until n could be covered; a lease shorter than wanted: until this node's
--   share of the refill covers it; else 0), time to a full bucket µs.
-- Errors for the whole call only for bad global arguments: "ERR hybridrate: bad <arg>".

local node = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local window_ms = tonumber(ARGV[3])
local prune_ms = tonumber(ARGV[4])
local recount_ms = tonumber(ARGV[5])
local now = tonumber(ARGV[6])
if node == nil or node == '' or string.find(node, ':', 1, true) then
  return redis.error_reply('ERR hybridrate: bad node id')
end
if lease_ms == nil or lease_ms ~= lease_ms or lease_ms < 1 or lease_ms > 1e9 then
  return redis.error_reply('ERR hybridrate: bad lease life')
end
if window_ms == nil or window_ms ~= window_ms or window_ms < 1 or window_ms > 1e9 then
  return redis.error_reply('ERR hybridrate: bad active window')
end
if prune_ms == nil or prune_ms ~= prune_ms or prune_ms < window_ms or prune_ms < lease_ms or prune_ms > 1e10 then
  return redis.error_reply('ERR hybridrate: bad prune age')
end
if recount_ms == nil or recount_ms ~= recount_ms or recount_ms < 1 or recount_ms > 1e9 then
  return redis.error_reply('ERR hybridrate: bad recount period')
end
if now == nil or now ~= now or now < 0 or now > 1e17 then
  return redis.error_reply('ERR hybridrate: bad time override')
end
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local now_ms = math.floor(now / 1000)
local field = 'n:' .. node
local NG, NA = 6, 11
if #ARGV ~= NG + NA * #KEYS then
  return redis.error_reply('ERR hybridrate: want ' .. (NG + NA * #KEYS) .. ' arguments, got ' .. #ARGV)
end
local MAXI = 9007199254740991
-- The leases of all nodes together take at most the burst; when the demand of the active nodes would
-- use more than the burst within a lease's horizon (want / demand), at most half of it, so that the
-- bucket keeps a reserve for a node whose lease runs out first.
local share_frac_busy = 0.5

-- num parses a finite number in [lo, hi]; integral when int is true.
local function num(s, lo, hi, int)
  local v = tonumber(s)
  if v == nil or v ~= v or v < lo or v > hi then return nil end
  if int and v ~= math.floor(v) then return nil end
  return v
end

-- clamp keeps a duration reply inside what an integer reply can carry (about 31 years in µs).
local function clamp(v)
  if v > 1e15 then return 1e15 end
  if v < 0 then return 0 end
  return v
end

-- parse reads a node record; nil when absent or malformed.
local function parse(s)
  if not s then return nil end
  local a, b, c, d, e, g, h = string.match(s, '^(%d+):(%d+):(%d+):(%d+):(%d+):([%d.]+):(%d+)$')
  if a == nil then return nil end
  return { inc = tonumber(a), seq = tonumber(b), cum = tonumber(c), used = tonumber(d), chg = tonumber(e),
           d = tonumber(g) or 0, seen = tonumber(h) }
end

local function format(r)
  return string.format('%d:%d:%d:%d:%d:%.3f:%d', r.inc, r.seq, r.cum, r.used, r.chg, r.d, r.seen)
end

local function process(i, key)
  local b = NG + (i - 1) * NA
  local inc = num(ARGV[b + 1], 0, MAXI, true)
  local seq = num(ARGV[b + 2], 1, MAXI, true)
  local cum = num(ARGV[b + 3], 0, MAXI, true)
  local acked = num(ARGV[b + 4], 0, MAXI, true)
  local used = num(ARGV[b + 5], 0, MAXI, true)
  local uacked = num(ARGV[b + 6], 0, MAXI, true)
  local demand = num(ARGV[b + 7], 0, 1e9, false)
  local want = num(ARGV[b + 8], 0, 1e9, true)
  local n = num(ARGV[b + 9], 0, 1e9, true)
  local rate = num(ARGV[b + 10], 1e-9, 1e9, false)
  local burst = num(ARGV[b + 11], 1, 1e9, true)
  local bad = nil
  if inc == nil then bad = 'inc'
  elseif seq == nil then bad = 'seq'
  elseif cum == nil then bad = 'cum'
  elseif acked == nil then bad = 'acked'
  elseif used == nil or used > cum then bad = 'used'
  elseif uacked == nil or uacked > used then bad = 'uacked'
  elseif demand == nil then bad = 'demand'
  elseif want == nil then bad = 'want'
  elseif rate == nil then bad = 'rate'
  elseif burst == nil then bad = 'burst'
  elseif n == nil or n > burst then bad = 'n'
  end
  if bad then error('hybridrate: bad ' .. bad .. ' for key ' .. i, 0) end

  local h = redis.call('HMGET', key, 't', 's', 'c', 'w', 'na', 'nt', 'x', field)
  local burst_u = burst * 1000000
  local tokens = tonumber(h[1])
  local ts = tonumber(h[2])
  local fresh = false
  if tokens == nil or tokens ~= tokens or ts == nil or ts ~= ts then
    tokens = burst_u
    ts = now
    fresh = true
  end
  local consumed = tonumber(h[3]) or 0
  local wsum = tonumber(h[4]) or 0
  local active = tonumber(h[5]) or 0
  local next_count = tonumber(h[6]) or 0
  local ttl_set = tonumber(h[7]) or -1
  local consumed0, wsum0, active0, next0 = consumed, wsum, active, next_count
  if fresh then consumed0, wsum0, active0, next0 = -1, -1, -1, -1 end -- a new bucket: write every field

  -- Refill by Redis time only (a clock that went backwards refills nothing).
  if now > ts then
    if tokens < burst_u then tokens = math.min(tokens + (now - ts) * rate, burst_u) end
    ts = now
  end

  if inc == 0 then
    -- A take by a node without local state for the key (its key cap is full of keys with consumption
    -- not yet counted): n is taken and counted now, nothing is leased, no record is kept.
    local status, retry = 0, 0
    if tokens >= n * 1000000 then
      tokens = tokens - n * 1000000
      consumed = consumed + n
      status = 1
    else
      retry = clamp(math.ceil((n * 1000000 - tokens) / rate))
    end
    tokens = math.floor(tokens)
    redis.call('HSET', key, 't', string.format('%d', tokens), 's', string.format('%d', ts), 'c', string.format('%d', consumed))
    redis.call('PEXPIRE', key, math.min(math.max(math.ceil(2000 * burst / rate), 2 * lease_ms) + 1000, 1e12))
    local full = 0
    if tokens < burst_u then full = clamp(math.ceil((burst_u - tokens) / rate)) end
    return { status, seq, 0, tokens, math.max(active, 1), retry, full }
  end

  local rec = parse(h[8])
  if rec ~= nil and rec.inc > inc then
    -- A late call from an incarnation the node has already replaced.
    return { -2, 0, acked, math.floor(tokens), math.max(active, 1), 0, 0 }
  end
  if rec ~= nil and rec.inc == inc and seq <= rec.seq then
    -- A replay or a late call: nothing changes.
    local full = 0
    if tokens < burst_u then full = clamp(math.ceil((burst_u - tokens) / rate)) end
    return { -2, rec.seq, rec.chg, math.floor(tokens), math.max(active, 1), 0, full }
  end
  local was_active = rec ~= nil and rec.seen >= now_ms - window_ms
  if rec ~= nil and rec.inc < inc then
    -- The node forgot the key and starts a new incarnation.
    if was_active then wsum = wsum - rec.d end
    rec = nil
  end
  if rec == nil then
    rec = { inc = inc, seq = 0, cum = acked, used = uacked, chg = acked, d = 0, seen = -1 }
    if was_active then
      was_active = false
      active = active - 1 -- counted again below
    end
  end

  -- Apply the report: admitted tokens to the accounting, consumption beyond the charge as debt.
  local newcum = math.max(cum, rec.cum)
  local newused = math.max(used, rec.used)
  if newused > rec.used then consumed = consumed + (newused - rec.used) end
  local chg = math.max(rec.chg, acked)
  if newcum > chg then
    tokens = tokens - (newcum - chg) * 1000000
    chg = newcum
  end

  -- Demand of the active nodes.
  if was_active then wsum = wsum - rec.d end
  wsum = wsum + demand
  if wsum < demand then wsum = demand end
  if not was_active then active = active + 1 end
  if active < 1 then active = 1 end

  -- Lease: bring this node's unused lease up to what it wants (at least n for a synchronous call),
  -- within its demand-weighted share of the burst, from whole tokens in the bucket.
  local status = -1
  local retry = 0
  local have = chg - newcum
  local target = math.max(want, n)
  if target > have then
    -- busy: the active nodes' demand would take more than the burst within a lease's horizon. Then
    -- the leases together take at most half the burst, and while the demand is below the rate (the
    -- refill keeps up) they leave the lower half of the bucket alone: a reserve for the node whose
    -- lease runs out first, so that nobody is denied while the key is under its limit.
    local share = target
    local reserve = 0
    if demand > 0 and wsum > 0 then
      local f = 1
      if wsum * want / demand > burst then
        f = share_frac_busy
        if wsum < rate then reserve = math.floor(burst * (1 - f)) end
      end
      share = math.max(math.floor(burst * f * demand / wsum + 0.5), 1)
    end
    local g = math.min(target, math.max(share, n)) - have
    local avail = math.floor(tokens / 1000000)
    -- A synchronous call may use the reserve for its n.
    g = math.min(g, math.max(avail - reserve, n - have), avail)
    if g < 0 then g = 0 end
    if n > 0 and have + g < n then
      -- A synchronous call that cannot be covered takes nothing.
      g = 0
      status = 0
      retry = clamp(math.ceil(((n - have) * 1000000 - tokens) / rate))
    else
      if n > 0 then
        -- The caller takes n from its lease at once: count them now (its next call reports them
        -- as used; counts are cumulative, so they are not counted twice).
        status = 1
        newused = newused + n
        consumed = consumed + n
      end
      local short = math.min(target, math.max(share, n)) - have - g
      if short > 0 and reserve == 0 then
        local frac = 1 / active
        if demand > 0 and wsum > 0 then frac = demand / wsum end
        -- Ask again once this node's share of the refill covers half its share of the burst (at
        -- least a token), or the shortfall if smaller, and do so at twice that pace: the nodes of a
        -- key over its limit collect the refill faster than it comes, so little of it waits in the
        -- bucket unclaimed, and a node is not told to wait longer than a few requests' worth.
        local need = math.min(short, math.max(1, math.ceil(share / 2)))
        retry = clamp(math.ceil(need * 500000 / (rate * frac)))
      end
    end
    tokens = tokens - g * 1000000
    chg = chg + g
  elseif n > 0 then
    status = 1
    newused = newused + n
    consumed = consumed + n
  end
  if tokens < -burst_u then tokens = -burst_u end

  rec.seq = seq
  rec.cum = newcum
  rec.used = newused
  rec.chg = chg
  rec.d = demand
  rec.seen = now_ms
  local own = format(rec)

  -- A periodic recount makes w and na exact again and prunes departed nodes.
  if now >= next_count then
    local all = redis.call('HGETALL', key)
    wsum, active = 0, 0
    for j = 1, #all, 2 do
      local f = all[j]
      if string.sub(f, 1, 2) == 'n:' then
        local r = parse(all[j + 1])
        if f == field then r = rec end
        if r == nil or r.seen < now_ms - prune_ms then
          redis.call('HDEL', key, f)
        else
          if r.seen >= now_ms - window_ms then
            active = active + 1
            wsum = wsum + r.d
          end
        end
      end
    end
    if active < 1 then active = 1 end
    next_count = now + recount_ms * 1000
  end

  tokens = math.floor(tokens)
  -- Keep the key while a full refill takes (twice, plus a second) and while any lease may be held;
  -- the TTL is refreshed once half of it has passed (every write command costs a few µs of Redis CPU).
  local ttl = math.min(math.max(math.ceil(2000 * burst / rate), 2 * lease_ms) + 1000, 1e12)
  local refresh = ttl_set < 0 or now_ms - ttl_set > ttl / 2 or now_ms < ttl_set
  -- Write only what changed.
  local w = { 't', string.format('%d', tokens), 's', string.format('%d', ts), field, own }
  if consumed ~= consumed0 then w[#w + 1] = 'c'; w[#w + 1] = string.format('%d', consumed) end
  if wsum ~= wsum0 then w[#w + 1] = 'w'; w[#w + 1] = string.format('%.3f', wsum) end
  if active ~= active0 then w[#w + 1] = 'na'; w[#w + 1] = active end
  if next_count ~= next0 then w[#w + 1] = 'nt'; w[#w + 1] = string.format('%d', next_count) end
  if refresh then w[#w + 1] = 'x'; w[#w + 1] = now_ms end
  redis.call('HSET', key, unpack(w))
  if refresh then redis.call('PEXPIRE', key, ttl) end

  local full = 0
  if tokens < burst_u then full = clamp(math.ceil((burst_u - tokens) / rate)) end
  return { status, seq, chg, tokens, active, retry, full }
end

local res = {}
for i = 1, #KEYS do
  local ok, r = pcall(process, i, KEYS[i])
  if not ok then
    local msg = r
    if type(msg) == 'table' then msg = msg.err or 'error' end
    r = { -3, tostring(msg), 0, 0, 0, 0, 0 }
  end
  for j = 1, 7 do res[#res + 1] = r[j] end
end
return res
