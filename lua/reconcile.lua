#!lua
-- reconcile.lua: apply nodes' consumed tokens to global token buckets, optionally take n, return the state.
--
-- One call handles one or more buckets (all KEYS must share a cluster slot). Each bucket is a hash:
--   tk  global tokens (float; may be negative down to -burst: debt)
--   ts  time of the last refill, microseconds of Redis TIME
--   c   tokens consumed in total (accounting, never decreases)
--   na  number of nodes active on the key within the active window
--   nt  next time (µs) the active count is recounted
--   n:<node>  "inc:applied:seen_ms:take_id:take_ok" — what this node has had applied (idempotency)
--
-- Idempotency: a node sends its cumulative consumption `cum` for the key, not a delta. The script applies
-- cum - applied when positive and remembers cum as applied, so a reconcile that is sent twice (a client
-- retry after a timeout) is counted once. A take (n > 0) carries a take_id; a replayed take returns the
-- stored verdict without taking again. `inc` is the node's incarnation of its local entry: a node that
-- forgot a key (evicted while clean) starts again at cum 0 with a larger inc, and `acked` (what the node
-- knows was applied) seeds `applied` when the field is missing (expired key) or from an older incarnation.
--
-- KEYS[i]  bucket key
-- ARGV[1]  node id (no ':'), ARGV[2] active window ms, ARGV[3] prune age ms,
-- ARGV[4]  time override in µs ("0" = use Redis TIME; tests only)
-- then 7 arguments per key, in KEYS order:
--   inc, cum, acked, n, take_id, rate (tokens/s), burst
-- Reply: 6 integers per key, in KEYS order:
--   allowed (1, 0, or -1 when n == 0), applied (the node's cum now applied, including a granted take),
--   tokens in micro-tokens (floor), active nodes, retry-after µs (0 when allowed), time to full µs.
-- Errors: "ERR hybridrate: bad <arg> for key <i>" for arguments that are not finite numbers in range.

local node = ARGV[1]
local window_ms = tonumber(ARGV[2])
local prune_ms = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if node == nil or node == '' or string.find(node, ':', 1, true) then
  return redis.error_reply('ERR hybridrate: bad node id')
end
if window_ms == nil or window_ms ~= window_ms or window_ms < 1 or window_ms > 1e9 then
  return redis.error_reply('ERR hybridrate: bad active window')
end
if prune_ms == nil or prune_ms ~= prune_ms or prune_ms < window_ms or prune_ms > 1e10 then
  return redis.error_reply('ERR hybridrate: bad prune age')
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
local nargs = 7
if #ARGV ~= 4 + nargs * #KEYS then
  return redis.error_reply('ERR hybridrate: want ' .. (4 + nargs * #KEYS) .. ' arguments, got ' .. #ARGV)
end

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
  return v
end

local out = {}
for i, key in ipairs(KEYS) do
  local b = 4 + (i - 1) * nargs
  local inc = num(ARGV[b + 1], 0, 9007199254740991, true)
  local cum = num(ARGV[b + 2], 0, 9007199254740991, true)
  local acked = num(ARGV[b + 3], 0, 9007199254740991, true)
  local rate = num(ARGV[b + 6], 1e-9, 1e9, false)
  local burst = num(ARGV[b + 7], 1, 1e9, true)
  local n = num(ARGV[b + 4], 0, 1e9, true)
  local take_id = ARGV[b + 5]
  local bad = nil
  if inc == nil then bad = 'inc'
  elseif cum == nil then bad = 'cum'
  elseif acked == nil or acked > cum then bad = 'acked'
  elseif rate == nil then bad = 'rate'
  elseif burst == nil then bad = 'burst'
  elseif n == nil or n > burst then bad = 'n'
  elseif take_id == nil or string.find(take_id, ':', 1, true) then bad = 'take id'
  end
  if bad then
    return redis.error_reply('ERR hybridrate: bad ' .. bad .. ' for key ' .. i)
  end

  local h = redis.call('HMGET', key, 'tk', 'ts', 'c', 'na', 'nt', field)
  local tokens = tonumber(h[1])
  local ts = tonumber(h[2])
  if tokens == nil or tokens ~= tokens or ts == nil or ts ~= ts then
    tokens = burst
    ts = now
  end
  -- Refill by Redis time only; a clock that went backwards refills nothing.
  if now > ts then
    tokens = tokens + (now - ts) * rate / 1000000
    ts = now
  end
  if tokens > burst then tokens = burst end
  local consumed = tonumber(h[3]) or 0
  local active = tonumber(h[4]) or 0
  local next_count = tonumber(h[5]) or 0

  -- What this node has already had applied.
  local applied = acked
  local seen_ms = -1
  local prev_take, prev_ok = nil, nil
  local stale = false
  if h[6] then
    local finc, fapplied, fseen, ftake, fok = string.match(h[6], '^(%d+):(%d+):(%d+):([^:]*):(%d)$')
    finc = tonumber(finc)
    if finc ~= nil then
      seen_ms = tonumber(fseen)
      if finc == inc then
        applied = tonumber(fapplied)
        prev_take, prev_ok = ftake, fok
      elseif finc > inc then
        stale = true -- a late call from an incarnation the node has already replaced
      end
    end
  end

  local allowed = -1
  local retry = 0
  if not stale then
    if cum > applied then
      local delta = cum - applied
      tokens = tokens - delta
      consumed = consumed + delta
      applied = cum
    end
    if n > 0 then
      if prev_take ~= nil and prev_take ~= '' and prev_take == take_id then
        allowed = tonumber(prev_ok) -- a replayed take: same verdict, nothing taken again
      elseif tokens >= n then
        tokens = tokens - n
        consumed = consumed + n
        applied = applied + n
        allowed = 1
      else
        allowed = 0
        retry = clamp(math.ceil((n - tokens) * 1000000 / rate))
      end
    end
    if tokens < -burst then tokens = -burst end

    -- Active nodes: a node counts once per window; a full recount prunes departed nodes.
    if seen_ms < now_ms - window_ms then active = active + 1 end
    if now >= next_count then
      local all = redis.call('HGETALL', key)
      active = 0
      for j = 1, #all, 2 do
        local f = all[j]
        if string.sub(f, 1, 2) == 'n:' then
          local fs = tonumber(string.match(all[j + 1], '^%d+:%d+:(%d+):'))
          if f == field then fs = now_ms end
          if fs == nil or fs < now_ms - prune_ms then
            redis.call('HDEL', key, f)
          elseif fs >= now_ms - window_ms then
            active = active + 1
          end
        end
      end
      next_count = now + window_ms * 500
    end
    if active < 1 then active = 1 end

    local take_field = take_id
    local ok_field = 0
    if n > 0 then
      ok_field = allowed
    elseif prev_take ~= nil then
      take_field, ok_field = prev_take, tonumber(prev_ok) or 0
    end
    redis.call('HSET', key, 'tk', tokens, 'ts', ts, 'c', consumed, 'na', active, 'nt', next_count,
      field, string.format('%d:%d:%d:%s:%d', inc, applied, now_ms, take_field, ok_field))
    -- Keep the key at least as long as a full refill takes (twice, plus a second), refreshed on each write.
    redis.call('PEXPIRE', key, math.min(math.ceil(2000 * burst / rate) + 1000, 1e12))
  end

  local full = 0
  if tokens < burst then full = clamp(math.ceil((burst - tokens) * 1000000 / rate)) end
  out[#out + 1] = allowed
  out[#out + 1] = applied
  out[#out + 1] = math.floor(tokens * 1000000)
  out[#out + 1] = active
  out[#out + 1] = retry
  out[#out + 1] = full
end
return out
