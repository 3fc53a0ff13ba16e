#!lua
-- reconcile.lua (key layout v6): lease tokens of global token buckets to nodes, and apply what the
-- nodes consumed beyond their leases.
--
-- One call handles one or more buckets (all KEYS must share a cluster slot). Each bucket is a hash
-- of two kinds of fields (packed into strings: every field read or written costs Redis CPU):
--   b   the bucket: t, s, c, w, nt, x, packed into 37 bytes with struct.pack('<i7I7I7I5i5i6', t, s,
--       c, w in milli-tokens/s, nt - s, x) where Redis's Lua has the struct library (every Redis
--       since 2.6), else (gopher-lua: miniredis, in tests) the text "t:s:c:w:nt:x", t and c decimal,
--       the others hexadecimal (lower case), w in milli-tokens/s. Each integer has the width it
--       needs (layout v6, issue 24: 37 bytes instead of v5's six float64s, 48), and is exact: struct
--       writes the low bytes of the number's integer value and reads them back sign- or zero-extended,
--       which is exact for integers of that width (all below 2^53):
--       t   tokens in the bucket, in micro-tokens (integer; negative: lent ahead or debt, down to
--           -(burst + rate·advance))
--       s   time of the last refill, µs of Redis TIME
--       c   tokens admitted in total, as the nodes report them (accounting; never decreases)
--       w   the demand on the key, tokens/s: the sum of the demands the active nodes declared,
--           stored rounded to milli-tokens/s (as the text always was), at most 2^40-1 of them
--       nt  next time (µs) the node records are scanned: w recomputed, departed nodes pruned;
--           stored as its offset from s, clamped to ±(2^39-1) µs (6.4 days: a later scan is
--           brought forward to then; a scan period is at most a minute or so in practice)
--       x   time (ms, Redis TIME even under a time override: Redis expires keys on its own clock)
--           the key's TTL was last set; it is set again once half of it has passed
--   n:<node>, or m<8 bytes>  this node's record (the field name is ARGV[1], built by the Go client:
--             "m" and the 8 bytes of a node id of 16 lower-case hexadecimal digits, as hybrid's
--             random ids are, else "n:" and the id; the two forms cannot collide, as their first
--             bytes differ, and each is one-to-one): inc, chg, used, demand (milli-tokens/s,
--             rounded), seen (ms), packed into 32 bytes with struct.pack('<I7I7I7I5I6') where
--             Redis's Lua has struct, else the text "inc:chg:used:demand:seen" (demand in tokens/s
--             with 3 decimals).
--   o   the key's one-off demand: the tokens/s that one-off takes (take.lua, and inc 0 here) took,
--       as an exponentially decayed rate with a time constant of one second, and the time (µs) it was
--       last updated: struct.pack('<dd') where Redis's Lua has struct, else the text "rate:time"
--       (rate in decimal, time in hexadecimal). Written only by one-off takes that are admitted; a
--       key without one has no such field. The nodes on one-off takes declare no demand (they keep
--       no record), so w alone undercounts a key they share with leasing nodes: the key's demand is
--       w plus this rate (issue 21).
--   ban the key's ban, if any: its deadline in ms of Redis TIME, in decimal (written by
--       bucketban.lua when the key is banned, deleted when it is unbanned; the ban list under
--       "<prefix>:v3:x:" keeps the same ban for the nodes' local copies). Read with the bucket in the
--       same HMGET, so that the first call for a key sees its ban whatever a node's local copy holds.
--
-- The limit is not part of the key (layouts v5 and v6): each call sends its own rate and burst, and the
-- bucket is refilled at the call's rate since its last write and clamped to the call's burst. A
-- changed limit so keeps the key's consumption (tokens above a lowered burst are dropped; a raised
-- burst fills at the rate from then on), and nodes that send different limits for one key count in
-- one bucket: the latest call's limit refills it, and each node's lease is sized by the limit it
-- sent.
-- Every value is an integer below 2^53 but w and demand, so a double holds it exactly; the times
-- (s, seen) fit their widths until the year 4000 (a time override is at most 7e16 µs).
--
-- Cost (what this layout is for): in Redis 7.0's Lua, tonumber of a decimal is glibc's strtod (about
-- 0.1 µs), of a hexadecimal strtoul (about 0.04 µs); string.format of the six bucket values costs
-- about 0.7 µs, string.match of them 0.8 µs and their tonumber 0.5 µs more, struct.pack and
-- struct.unpack of them about 0.16 µs each, a table per key about 0.2 µs. BenchmarkReconcileRedisCPU
-- (bench/; docs/benchmarks.md) measures Redis's CPU per key with 8 node records per key: in calls of
-- 20 keys, layout v2 took 9.4–9.9 µs per key (median), v3 6.6–6.8 µs; in a later session, v3
-- 6.5 µs and v4 5.1 µs (medians of five alternating runs).
--
-- The model. A node's lease is tokens taken from the bucket in advance: it may consume them without
-- asking. `chg` is the tokens charged to the node's incarnation in total (leases and debt); the node
-- reports `cum`, what it consumed (admitted, plus unused lease it wrote off when the lease expired).
-- Consumption beyond chg (a node's small overdraft credit, a failure policy's admissions) is charged
-- when reported, as debt. A lease is at most the node's demand-weighted share of what can be lent
-- (the burst, plus `advance` of refill while the key is under its rate; the shares of all nodes add
-- up to at most that, less half a burst kept in reserve when the demand is high) and is used
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
-- ARGV[1]  this node's record field ("n:<node id>", the id without ':', or "m" and 8 bytes: above),
-- ARGV[2] prune age ms (a node's record is dropped this long after its
-- last call), ARGV[3] scan period ms, ARGV[4] active window ms (a node's demand counts in w this
-- long after its last call), ARGV[5] lease horizon ms (a lease is sized to last this long),
-- ARGV[6] lease advance ms (while the key's demand is under its rate, renewals may draw
-- on what that demand takes of the coming refill over this long: the bucket may be lent down to
-- -rate·advance at most; 0 = only tokens in the bucket),
-- ARGV[7] the fleet's size (the live limiters of the fleet registry, fleet.lua; "0" = unknown): a
-- node whose demand-weighted share of a key rounds below a token gets one token anyway only while
-- the fleet could not hold more than the lendable amount that way (fleet ≤ burst + advance), so
-- that such floors never add up to more than one lendable amount, whatever the fleet's size,
-- ARGV[8] time override in µs ("0" = use Redis TIME; the fleet simulator and tests)
-- then one argument per key, in KEYS order: 10 little-endian float64s (80 bytes, as
--   struct.pack('<dddddddddd') writes them): inc, cum, acked, used, uacked, demand (this node's
--   demand, tokens/s), want (unused lease wanted after the call), n (tokens the caller must have now,
--   0 for a background call), rate (tokens/s), burst. One packed argument instead of ten numbers in
--   text costs Redis about 1 µs less per key: one string to read from the request and hand to Lua
--   instead of ten, and one struct.unpack instead of ten tonumber (docs/benchmarks.md).
-- Reply: 6 integers per key, in KEYS order:
--   status: 1 n covered (a lease of at least n is held, and n is counted), 0 n denied, -1 background
--           call done, -2 a late call from a replaced incarnation (nothing changed), 2 the key is
--           banned (the report was applied, nothing was granted, n is denied; retry: the ban's
--           remaining time),
--           -3 this key failed (the second element is the error message; other keys are unaffected)
--   chg, tokens in micro-tokens that could be lent now (floor, after the call: the bucket, plus the
--   advance while the key is under its rate, at most a burst), the key's demand in milli-tokens/s,
--   retry µs (n denied: until n could be covered; a lease shorter than wanted while the key is over
--   its rate: when this node should ask again; else 0), time to a full bucket µs.
-- Errors for the whole call only for bad global arguments: "ERR hybridrate: bad <arg>".

-- Library functions as locals: a global lookup per call costs Redis CPU in a per-key loop.
local floor, ceil, mmin, mmax = math.floor, math.ceil, math.min, math.max
local smatch, sformat, sfind, ssub, tonum = string.match, string.format, string.find, string.sub, tonumber
local rcall = redis.call
local argv = ARGV
-- The node records' packing: struct where Redis has it (see the header). rawget: reading a missing
-- global is an error in Redis and in miniredis.
local spack, sunpack
local st = rawget(_G, 'struct')
if st ~= nil then spack, sunpack = st.pack, st.unpack end

local field = ARGV[1]
local prune_ms = tonum(ARGV[2])
local scan_ms = tonum(ARGV[3])
local window_ms = tonum(ARGV[4])
local horizon_ms = tonum(ARGV[5])
local advance_ms = tonum(ARGV[6])
local fleet_n = tonum(ARGV[7])
local now = tonum(ARGV[8])
if field == nil or not ((#field == 9 and ssub(field, 1, 1) == 'm') or
    (#field > 2 and ssub(field, 1, 2) == 'n:' and not sfind(field, ':', 3, true))) then
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
if advance_ms == nil or advance_ms ~= advance_ms or advance_ms < 0 or advance_ms > 1e9 then
  return redis.error_reply('ERR hybridrate: bad lease advance')
end
if fleet_n == nil or fleet_n ~= fleet_n or fleet_n < 0 or fleet_n > 1e9 then
  return redis.error_reply('ERR hybridrate: bad fleet size')
end
if now == nil or now ~= now or now < 0 or now > 7e16 then
  return redis.error_reply('ERR hybridrate: bad time override')
end
local ttl_ms -- Redis's own clock in ms: it expires keys, so a key's TTL is kept on it (the x field)
if now == 0 then
  local t = rcall('TIME')
  now = tonum(t[1]) * 1000000 + tonum(t[2])
else
  local t = rcall('TIME')
  ttl_ms = floor((tonum(t[1]) * 1000000 + tonum(t[2])) / 1000)
end
local now_ms = floor(now / 1000)
if ttl_ms == nil then ttl_ms = now_ms end
local NG = 8
if #ARGV ~= NG + #KEYS then
  return redis.error_reply('ERR hybridrate: want ' .. (NG + #KEYS) .. ' arguments, got ' .. #ARGV)
end
local MAXI = 9007199254740991

-- clamp keeps a duration reply inside what an integer reply can carry (about 31 years in µs).
local function clamp(v)
  if v > 1e15 then return 1e15 end
  if v < 0 then return 0 end
  return v
end

-- parse reads a node record: inc, chg, used, d, seen; nil when absent or malformed. (Values, not
-- a table: a table per key costs Redis CPU.)
local function parse(s)
  if not s then return nil end
  if sunpack then
    if #s ~= 32 then return nil end
    local inc, chg, used, dm, seen = sunpack('<I7I7I7I5I6', s)
    return inc, chg, used, dm / 1000, seen
  end
  local a, b, c, d, e = smatch(s, '^(%d+):(%d+):(%d+):([%d.]+):(%d+)$')
  if a == nil then return nil end
  return tonum(a), tonum(b), tonum(c), tonum(d), tonum(e)
end

-- unpack10 reads a key's argument: ten little-endian float64s; nil when it is not 80 bytes long.
-- Where Lua has no struct library (gopher-lua: miniredis, in tests), f64 decodes them.
local sbyte, ldexp = string.byte, math.ldexp
local function f64(s, i)
  local b1, b2, b3, b4, b5, b6, b7, b8 = sbyte(s, i, i + 7)
  local sign = 1
  if b8 >= 128 then sign, b8 = -1, b8 - 128 end
  local e = b8 * 16 + floor(b7 / 16)
  local m = ((((((b7 % 16) * 256 + b6) * 256 + b5) * 256 + b4) * 256 + b3) * 256 + b2) * 256 + b1
  if e == 2047 then
    if m == 0 then return sign / 0 end
    return 0 / 0
  end
  if e == 0 then return sign * ldexp(m, -1074) end
  return sign * ldexp(m + 4503599627370496, e - 1075)
end
local function unpack10(s)
  if #s ~= 80 then return nil end
  if sunpack then return sunpack('<dddddddddd', s) end
  return f64(s, 1), f64(s, 9), f64(s, 17), f64(s, 25), f64(s, 33), f64(s, 41), f64(s, 49), f64(s, 57),
    f64(s, 65), f64(s, 73)
end

-- unbucket reads the bucket field: tokens, ts, consumed, w (tokens/s), next_scan, ttl_set; nil when
-- malformed.
local function unbucket(s)
  if sunpack then
    if #s ~= 37 then return nil end
    local t, ts, c, wm, dnt, x = sunpack('<i7I7I7I5i5i6', s)
    return t, ts, c, wm / 1000, ts + dnt, x
  end
  local t1, t2, t3, t4, t5, t6 = smatch(s, '^(%-?%d+):(%x+):(%d+):(%x+):(%x+):(%x+)$')
  if t1 == nil then return nil end
  return tonum(t1), tonum(t2, 16), tonum(t3), tonum(t4, 16) / 1000, tonum(t5, 16), tonum(t6, 16)
end

-- The widths' bounds: w in milli-tokens/s (5 bytes, unsigned) and nt - s in µs (5 bytes, signed).
local W_MAX, NT_MAX = 1099511627775, 549755813887

-- bucket packs the bucket field (see unbucket).
local function bucket(tokens, ts, consumed, w, next_scan, ttl_set)
  if spack then
    local wm = floor(w * 1000 + 0.5)
    if wm > W_MAX then wm = W_MAX elseif wm < 0 then wm = 0 end
    local dnt = next_scan - ts
    if dnt > NT_MAX then dnt = NT_MAX elseif dnt < -NT_MAX then dnt = -NT_MAX end
    return spack('<i7I7I7I5i5i6', tokens, ts, consumed, wm, dnt, ttl_set)
  end
  return sformat('%d:%x:%d:%x:%x:%x', tokens, ts, consumed, w * 1000 + 0.5, next_scan, ttl_set)
end

-- ONEOFF_TAU is the time constant of the one-off demand (the o field), µs: one second, the pace
-- at which a fleet's nodes move from one-off takes to leases at start-up (hybrid's direct rule).
local ONEOFF_TAU = 1000000
local mexp = math.exp

-- oneoff reads the o field: the one-off demand's rate (tokens/s), decayed to now; 0 when absent
-- or malformed.
local function oneoff(s)
  if not s then return 0 end
  local r, t
  if sunpack then
    if #s ~= 16 then return 0 end
    r, t = sunpack('<dd', s)
  else
    local a, b = smatch(s, '^([%d.]+):(%x+)$')
    if a == nil then return 0 end
    r, t = tonum(a), tonum(b, 16)
  end
  if not (r >= 0 and r <= 1e12) then return 0 end
  if now > t then r = r * mexp((t - now) / ONEOFF_TAU) end
  return r
end

-- oneoffpack packs the o field with rate r (tokens/s) at now.
local function oneoffpack(r)
  if spack then return spack('<dd', r, now) end
  return sformat('%.6f:%x', r, now)
end

-- record packs a node record (see parse).
local function record(inc, chg, used, d, seen)
  if spack then return spack('<I7I7I7I5I6', inc, chg, used, floor(d * 1000 + 0.5), seen) end
  return sformat('%d:%d:%d:%.3f:%d', inc, chg, used, d, seen)
end

local function process(i, key)
  -- Checked inline (no function calls): NaN fails every comparison, so "not (lo <= x and x <= hi)"
  -- rejects it, and an infinity fails the bounds; "x % 1 == 0" requires an integer.
  local inc, cum, acked, used, uacked, demand, want, n, rate, burst = unpack10(argv[NG + i])
  local bad = nil
  if inc == nil then bad = 'arguments (want 80 bytes)' -- else unpack10 gave all ten numbers
  elseif not (inc >= 0 and inc <= MAXI and inc % 1 == 0) then bad = 'inc'
  elseif not (cum >= 0 and cum <= MAXI and cum % 1 == 0) then bad = 'cum'
  elseif not (acked >= 0 and acked <= MAXI and acked % 1 == 0) then bad = 'acked'
  elseif not (used >= 0 and used <= cum and used % 1 == 0) then bad = 'used'
  elseif not (uacked >= 0 and uacked <= MAXI and uacked % 1 == 0) then bad = 'uacked'
  elseif not (demand >= 0 and demand <= 1e9) then bad = 'demand'
  elseif not (want >= 0 and want <= 1e9 and want % 1 == 0) then bad = 'want'
  elseif not (rate >= 1e-9 and rate <= 1e9) then bad = 'rate'
  elseif not (burst >= 1 and burst <= 1e9 and burst % 1 == 0) then bad = 'burst'
  elseif not (n >= 0 and n <= burst and n % 1 == 0) then bad = 'n'
  end
  if bad then error('hybridrate: bad ' .. bad .. ' for key ' .. i, 0) end

  local h = rcall('HMGET', key, 'b', field, 'ban', 'o')
  local burst_u = burst * 1000000
  local ow = oneoff(h[4]) -- the one-off takes' demand (tokens/s), not part of w
  local tokens, ts, consumed, w, next_scan, ttl_set
  if h[1] then tokens, ts, consumed, w, next_scan, ttl_set = unbucket(h[1]) end
  if tokens == nil then
    -- A new bucket (or an unreadable one): full.
    tokens, ts, consumed, w, next_scan, ttl_set = burst_u, now, 0, 0, now + scan_ms * 1000, -1
  end

  -- Refill by Redis time only (a clock that went backwards refills nothing).
  if now > ts then
    if tokens < burst_u then
      tokens = tokens + (now - ts) * rate
      if tokens > burst_u then tokens = burst_u end
    end
    ts = now
  end
  -- A burst lowered since the bucket's last write (the limit is not part of the key): clamp.
  if tokens > burst_u then tokens = burst_u end
  -- The key's ban: until then, nothing is granted or taken.
  local ban = tonum(h[3])
  if ban ~= nil and ban <= ttl_ms then ban = nil end
  -- Keep the key while a full refill (of a burst and the advance) takes, twice, plus a second, and
  -- at least the active window: a lease is used for at most a lease life (half the window), and the
  -- bucket that lent it must outlive it (its debt, its count of admitted tokens).
  local adv_max = floor(rate * advance_ms / 1000) -- the refill leases may draw on, whole tokens
  local ttl = mmin(mmax(ceil(2000 * (burst + adv_max) / rate) + 1000, window_ms), 1e12)

  if inc == 0 then
    if ban then
      return 2, 0, floor(tokens), floor((w + ow) * 1000), clamp((ban - ttl_ms) * 1000), clamp(ceil((burst_u - tokens) / rate))
    end
    -- A one-off take: by a node without local state for the key (its key cap is full of keys with
    -- consumption not yet counted), or by a node that sees the key too rarely for a token of it on
    -- a fleet larger than the burst (issue 21). n is taken and counted now, nothing is leased, no
    -- record is kept: it costs Redis what a central bucket's decision does. A denial writes
    -- nothing (the refill is recomputed from the stored time next call, with the same result).
    if tokens < n * 1000000 then
      return 0, 0, floor(tokens), floor((w + ow) * 1000), clamp(ceil((n * 1000000 - tokens) / rate)),
        clamp(ceil((burst_u - tokens) / rate))
    end
    tokens = floor(tokens - n * 1000000)
    consumed = consumed + n
    local refresh = ttl_set < 0 or ttl_ms - ttl_set > ttl / 2 or ttl_ms < ttl_set
    if refresh then ttl_set = ttl_ms end
    -- The take counts in the key's one-off demand (the o field).
    ow = ow + n * 1000000 / ONEOFF_TAU
    rcall('HSET', key, 'b', bucket(tokens, ts, consumed, w, next_scan, ttl_set), 'o', oneoffpack(ow))
    if refresh then rcall('PEXPIRE', key, ttl) end
    return 1, 0, tokens, floor((w + ow) * 1000), 0, clamp(ceil((burst_u - tokens) / rate))
  end

  -- This node's record (rec_*: inc, chg, used, d, seen).
  local rec_inc, rec_chg, rec_used, rec_d, rec_seen = parse(h[2])
  if rec_inc ~= nil and rec_inc > inc then
    -- A late call from an incarnation the node has already replaced.
    return -2, acked, floor(tokens), floor((w + ow) * 1000), 0, clamp(ceil((burst_u - tokens) / rate))
  end
  -- Demand: the node's declared demand replaces what it declared before (if that still counts).
  if rec_inc ~= nil and rec_seen >= now_ms - window_ms then w = w - rec_d end
  -- The node has called for this key before (with this incarnation), and either declared a demand
  -- then or called a second or more ago: its demand is known. A call a few milliseconds after a
  -- first call that declared nothing is a key's first burst, whose demand the node reads over a
  -- second (local.youngDemand): lending it the coming refill let a burst of 20 on a quiet key of
  -- burst 5 admit 6 (examples/httpapi).
  local known = rec_inc == inc and (rec_d > 0 or now_ms - rec_seen >= 1000)
  if rec_inc == nil or rec_inc < inc then
    rec_inc, rec_chg, rec_used = inc, acked, uacked
  end
  rec_d = demand
  w = w + demand
  if w < demand then w = demand end

  -- Apply the report: admitted tokens to the accounting, consumption beyond the charge as debt.
  if used > rec_used then
    consumed = consumed + (used - rec_used)
    rec_used = used
  end
  if cum > rec_chg then
    tokens = tokens - (cum - rec_chg) * 1000000
    rec_chg = cum
  end

  -- Lease: bring this node's unused lease up to what it wants (at least n for a synchronous call),
  -- within its demand-weighted share of the burst, from whole tokens in the bucket. While the key's
  -- demand is under its rate, the refill of the next `advance` is lent too: the bucket may go down to
  -- -rate·advance, which the refill repays because the demand is below it.
  local status = -1
  local retry = 0
  local have = rec_chg - cum
  local target = mmax(want, n)
  -- The key's demand, by which a node's share is sized: the nodes' declared demand and the one-off
  -- takes' (the o field). Whether the key is under its rate (the advance, the lend, the reserve) is
  -- read from the declared demand alone (wd): a node that leaves one-off takes declares their rate
  -- while the o field still counts them for a second or two, and read from the sum, small per-user
  -- keys (burst 10 on 12 nodes) lost the advance and the reserve's shape while under their rate
  -- (fleet simulator: 0.63% of an exact bucket's tokens denied, 0.25% this way, 0.41% before the
  -- o field; hot keys on 512 nodes 0.19%, 0.00%, 0.64%).
  local wv = mmax(w + ow, demand)
  local wd = mmax(w, demand)
  local granted = true
  -- The advance is lent while the key's demand is under its rate, and only what that demand
  -- takes over the advance, to a background renewal (n = 0) or to a caller whose node's demand is
  -- known (above): a key that was idle (its demand near 0), or a node's first calls that need
  -- tokens now (a new key's first burst), gets no refill ahead of time, so a sudden burst on such
  -- a key takes at most its burst; a busy node that runs dry between renewals still finds the
  -- refill it was lent from.
  -- (Until 2026-11-27 the advance was lent up to 1.25× the rate, as a margin for demand estimates
  -- that ran high; a key between 1 and 1.25× its rate then kept the advance, and its overshoot,
  -- for good. The nodes' young estimate (local.youngDemand) made the margin unneeded.)
  -- At or over its rate, the same calls may lend the refill in flight instead (`lend`, not told to
  -- the node): over the limit, each token a node holds waits for that node's next request, 1/d_i
  -- on average, so the nodes hold about Σ rate·(d_i/W)·(1/d_i) = rate·N/W tokens between them
  -- (Little's law), tokens an exact bucket would have admitted at once. Letting a node's call take
  -- the bucket down to -rate/d_i (its own term, rounded; at most rate·advance, the advance's floor)
  -- makes the refill repay what the leases hold instead of the key losing it: on loadgen's zipf
  -- scenario, false denials went from 0.64% to 0.25% of the exact bucket's tokens. (Half that
  -- term, rounded down, was tried in issue 21's tenth session: a key at 2–3× its rate on 12 nodes
  -- no longer ended a run 1–3 tokens over Burst + Rate·T, but loadgen's zipf scenario on 8 nodes
  -- then left 0.82% of the exact bucket's tokens not admitted, against its target of 0.5%.) Only
  -- while other nodes declare demand on the key (w > demand): a node alone on a key holds no tokens
  -- elsewhere, and the lend let a burst of 5 requests on a key of burst 3 and 1/s admit 4. On a
  -- fleet larger than the burst, at most a quarter of the burst: the lend is debt, repaid only as the inventory
  -- it stands for is spent, and on 128 nodes (keys of 80/s, burst 80 at 4×, a lend of 32) the
  -- worst key admitted 1.011 of Burst + Rate·T; capped at burst/4, 0.997–0.999, with 1.1% of an
  -- exact bucket's tokens not admitted (0.2% uncapped; 2.3% at burst/8, 2.9% at burst/16). On
  -- smaller fleets the cap cost honest keys (small, burst 10 on 8 nodes: 0.50% of the exact
  -- bucket's tokens denied uncapped, 0.61% capped; the fleet simulator, docs/benchmarks.md).
  local adv = 0
  local lend = 0
  -- Neither is lent on a fleet larger than what can be lent (issue 21). There, the nodes that see
  -- the key rarely send one-off takes (take.lua), which declare no demand, so w undercounts the
  -- key's demand and cannot tell that it is over its rate (on the fleet simulator, keys at 4× their
  -- limit on 512 nodes were lent the advance and admitted 1.10× their allowance); and nodes whose
  -- share is under a token hold no lease, so there is little inventory for the lend to make up for.
  if (n == 0 or known) and fleet_n <= burst + adv_max then
    if wd < rate then
      adv = mmin(adv_max, floor(wd * advance_ms / 1000))
    elseif demand > 0 and w > demand then
      lend = mmin(adv_max, floor(rate / demand + 0.5))
      if fleet_n > burst then lend = mmin(lend, mmax(floor(burst / 4), 1)) end
    end
  end
  if ban then
    -- Banned: the report above is applied (consumption is never forgotten), nothing is granted, and
    -- the node is told for how long (it denies the key locally until then).
    target, status, granted, retry = 0, 2, false, clamp((ban - ttl_ms) * 1000)
    if ttl < ban - ttl_ms then ttl = ban - ttl_ms end -- the bucket keeps the ban as long as it lasts
  end
  if target > have then
    -- Each node's lease is at most its demand-weighted share of what can be lent (burst + advance).
    -- When the key's demand would take more than that within a lease's horizon while staying below
    -- the rate (the refill keeps up), leases come only from the upper half: the lower half is a
    -- reserve for the node whose lease runs out first, so that nobody is denied while the key is
    -- under its limit. On a fleet larger than the burst (issue 21), a key under its rate keeps in
    -- reserve all of its burst but half this node's share of the declared demand: there most of
    -- the key's decisions are synchronous calls (hybrid's direct rule: a node's share is under a
    -- token) that declare no demand, so the few leasing nodes' shares read too large, and tokens
    -- leased to them waited there while those calls found the bucket empty (fleet simulator,
    -- 3,000 keys at 0.7× a limit of 5/s, burst 10, on 12 nodes: 1.3% of what an exact bucket
    -- admits denied; 0.42% with this reserve). A node with all the declared demand (a key pinned
    -- to its home node) still leases half the burst: with the whole burst in reserve, loadgen's
    -- sticky scenario on 64 nodes went from 89.8% of decisions local to 0.4%.
    local cap = burst + adv
    local share = target
    local reserve = 0
    if demand > 0 and wv > 0 then
      if wd < rate then
        if fleet_n > burst then reserve = burst - floor(burst * mmin(demand / wd, 1) / 2)
        elseif wd * horizon_ms / 1000 > cap then reserve = floor(burst / 2) end
      end
      share = floor(cap * demand / wv + 0.5)
      -- A share under a token rounds up to one only on a fleet too small for such floors to add up
      -- to more than what can be lent (issue 21): on a large fleet, a node that sees the key too
      -- rarely for a token of it gets no lease (its requests ask Redis: a synchronous call still
      -- takes its n), rather than a token that waits at it unused while the others run dry.
      if share < 1 and fleet_n <= cap then share = 1 end
    end
    local g = mmin(target, mmax(share, n)) - have
    local avail = floor(tokens / 1000000) + adv + lend
    -- A synchronous call may use the reserve for its n.
    g = mmin(g, mmax(avail - reserve, n - have), avail)
    if g < 0 then g = 0 end
    if n > 0 and have + g < n then
      -- A synchronous call that cannot be covered takes nothing.
      g = 0
      granted = false
      status = 0
      retry = clamp(ceil(((n - have - adv - lend) * 1000000 - tokens) / rate))
    else
      local short = mmin(target, mmax(share, n)) - have - g
      if short > 0 and reserve == 0 then
        local frac = 1
        if demand > 0 and wv > 0 then frac = demand / wv end
        -- Ask again once this node's share of the refill covers half its share of the burst (at
        -- least a token), or the shortfall if smaller, and do so at four times that pace: the
        -- nodes of a key over its limit collect the refill faster than it comes, so little of it
        -- waits in the bucket unclaimed, each grant is small (what a node holds unused when its
        -- traffic stops is lost to the others until its lease life ends: at three times the pace,
        -- the default loadgen run, 2 s at 4× overload, ended with ~30 tokens a key stranded in
        -- leases, admitted/exact 0.963–0.972), and a node is not told to wait longer than a few
        -- requests' worth.
        local need = mmin(short, mmax(1, ceil(share / 2)))
        retry = clamp(ceil(need * 250000 / (rate * frac)))
      end
    end
    tokens = tokens - g * 1000000
    rec_chg = rec_chg + g
  end
  if n > 0 and granted then
    -- The caller takes n from its lease at once: count them now. Its next call reports them as used;
    -- counts are cumulative (max), so they are not counted twice, and a replayed call neither.
    status = 1
    local u = mmax(rec_used, used + n)
    consumed = consumed + (u - rec_used)
    rec_used = u
  end
  -- Debt floor: a burst below what leases may lend (a failure policy's admissions beyond it are
  -- forgiven, so that a key is not blocked for long after an outage).
  local floor_u = (burst + adv_max) * 1000000
  if tokens < -floor_u then tokens = -floor_u end
  rec_seen = now_ms

  -- Now and then, recompute w from the nodes active within the window and drop the records of
  -- nodes gone for longer than the prune age.
  if now >= next_scan then
    local all = rcall('HGETALL', key)
    w = demand
    for j = 1, #all, 2 do
      local f = all[j]
      if f ~= field and ((#f == 9 and ssub(f, 1, 1) == 'm') or ssub(f, 1, 2) == 'n:') then
        -- Only the demand and the last-seen time are read (a packed record's last 11 bytes):
        -- struct.unpack of integers of odd widths costs more than of doubles, per number.
        local r_inc, r_d, r_seen
        if sunpack then
          local v = all[j + 1]
          if #v == 32 then
            r_inc = 0
            r_d, r_seen = sunpack('<I5I6', v, 22)
            r_d = r_d / 1000
          end
        else
          local c2, c3
          r_inc, c2, c3, r_d, r_seen = parse(all[j + 1])
        end
        if r_inc == nil or r_seen < now_ms - prune_ms then
          rcall('HDEL', key, f)
        elseif r_seen >= now_ms - window_ms then
          w = w + r_d
        end
      end
    end
    next_scan = now + scan_ms * 1000
  end

  tokens = floor(tokens)
  -- Keep the key for ttl (above), refreshed once half of it has
  -- passed (every write command costs a few µs of Redis CPU).
  local refresh = ttl_set < 0 or ttl_ms - ttl_set > ttl / 2 or ttl_ms < ttl_set
  if refresh then ttl_set = ttl_ms end
  rcall('HSET', key,
    'b', bucket(tokens, ts, consumed, w, next_scan, ttl_set),
    field, record(rec_inc, rec_chg, rec_used, rec_d, rec_seen))
  if refresh then rcall('PEXPIRE', key, ttl) end
  -- The node is told what could be lent to it now (the bucket plus the advance, at most a burst).
  return status, rec_chg, mmin(tokens + adv * 1000000, burst_u), floor((w + ow) * 1000), retry,
    clamp(ceil((burst_u - tokens) / rate))
end

local res = {}
local keys = KEYS
for i = 1, #keys do
  local j = 6 * (i - 1)
  local ok, r1, r2, r3, r4, r5, r6 = pcall(process, i, keys[i])
  if not ok then
    -- (Two statements: gopher-lua, miniredis's Lua, assigns r1 before it evaluates tostring(r1).)
    if type(r1) == 'table' then r1 = r1.err or 'error' end
    r2 = tostring(r1)
    r1, r3, r4, r5, r6 = -3, 0, 0, 0, 0
  end
  res[j + 1], res[j + 2], res[j + 3], res[j + 4], res[j + 5], res[j + 6] = r1, r2, r3, r4, r5, r6
end
return res
