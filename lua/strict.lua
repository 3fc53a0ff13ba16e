#!lua
-- strict.lua: strict central rate limiting. One call evaluates one or more rules atomically: every rule
-- is checked first, and only when all of them allow does every rule consume (all or nothing).
--
-- This file is the driver. Each algorithm lives in its own file (token_bucket.lua, gcra.lua,
-- fixed_window.lua, sliding_window.lua, sliding_log.lua, leaky_bucket.lua); package central splices the
-- ones a script needs in place of the "@algorithms" marker line below, so that every assembled script
-- is one self-contained, atomic script that starts with this "#!lua" line.
--
-- KEYS     the state keys of the rules, in rule order; each algorithm uses nkeys of them (1, or 2 for
--          the sliding log). All keys of one call share a hash tag (one cluster slot); none repeats.
-- ARGV[1]  time override in µs (tests only); "0" means Redis TIME, which production always uses
-- ARGV[2]  max wait in µs: the longest delay the leaky-bucket shaper may hand out; "0" for the others
-- then 4 arguments per rule: algorithm code, limit (integer 1..1e9), period in µs (integer
--          1000..1e14), n (integer 1..limit; 0..1e9 for an algorithm that counts refused hits)
-- Reply: {all, then 4 integers per rule: ok, remaining, wait_us, reset_us}
--   all        1 when every rule allowed and consumed; 0 when no rule consumed anything, except the
--              rules of an algorithm with counts_refused (uw), which consume their n either way
--   ok         1 when this rule alone had room for its n
--   remaining  whole units left (after consumption when all = 1; as they stand otherwise), at least 0;
--              for a counts_refused algorithm, the limit minus the count, negative when it is above
--   wait_us    ok = 0: how long until n would fit (retry-after, with no other traffic);
--              ok = 1: how long the work must wait before it runs (0 except for the shaper)
--   reset_us   how long until the rule is back to its full allowance, with no further traffic
-- Errors: "ERR hybridrate: bad <what>" for an argument that is missing, not a number, NaN, infinite,
-- fractional or out of range, and for a repeated key; nothing is written.
--
-- Numbers: every time is an integer count of µs (Redis TIME is exact in a double); fractional state is
-- stored through redis.call, which formats numbers with 17 significant digits (never tostring, which
-- keeps 14 and would round a µs timestamp); the reply holds integers only, because Redis truncates Lua
-- numbers in replies.
--
-- An algorithm is a table A[code] with:
--   nkeys     how many KEYS it uses, starting at KEYS[r.k]
--   load(r)   read rule r's state (read-only) into fields of r; r has k, limit, period, n, now, max_wait
--   check(r)  -> ok, wait_us: from the loaded state, read-only
--   take(r)   consume r.n: update r's fields and write the state, with its TTL
--   view(r)   -> remaining, reset_us: from r's fields (taken or not)
--   counts_refused  optional: true when take(r) runs whether or not the call admits (upstream's
--             counting), and n may be 0 (a read) or above the limit

-- TOL is the slack, in µs, of comparisons made on fractional times: a deficit that would be refilled
-- within a nanosecond (plus a 1e-13 share of the period, for float rounding) counts as no deficit.
local function tol(period) return 1e-3 + period * 1e-13 end

-- ceil_us rounds a positive time in µs up to a whole µs, ignoring float noise below the tolerance;
-- it answers at least 1 for a real deficit.
local function ceil_us(x, period)
  local v = math.ceil(x - tol(period))
  if v < 1 then v = 1 end
  if v > 1e15 then v = 1e15 end
  return v
end

-- ttl_ms converts a lifetime of us µs to whole ms, rounded up, plus one ms of margin (a key is only
-- deleted once its state means "nothing recorded", so an early expiry could never admit too much).
local function ttl_ms(us)
  return math.max(1, math.min(math.ceil(us / 1000) + 1, 1e12))
end

-- ttl sets key to expire after us µs (see ttl_ms).
local function ttl(key, us)
  redis.call('PEXPIRE', key, ttl_ms(us))
end

-- num parses an integer in [lo, hi]; nil for anything else (nil, garbage, NaN, ±inf, fractions).
local function num(s, lo, hi)
  local v = tonumber(s)
  if v == nil or v ~= v or v < lo or v > hi or v ~= math.floor(v) then return nil end
  return v
end

local A = {}

-- @algorithms

local now = num(ARGV[1], 0, 1e17)
if now == nil then return redis.error_reply('ERR hybridrate: bad time override') end
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local max_wait = num(ARGV[2], 0, 1e14)
if max_wait == nil then return redis.error_reply('ERR hybridrate: bad max wait') end
if #ARGV < 6 or (#ARGV - 2) % 4 ~= 0 then
  return redis.error_reply('ERR hybridrate: bad argument count ' .. #ARGV)
end

local rules = {}
local k = 1
for i = 1, (#ARGV - 2) / 4 do
  local b = 2 + (i - 1) * 4
  local alg = A[ARGV[b + 1]]
  local limit = num(ARGV[b + 2], 1, 1e9)
  local period = num(ARGV[b + 3], 1000, 1e14)
  local n = nil
  if alg ~= nil and alg.counts_refused then n = num(ARGV[b + 4], 0, 1e9) else n = num(ARGV[b + 4], 1, 1e9) end
  local bad = nil
  if alg == nil then bad = 'algorithm'
  elseif limit == nil then bad = 'limit'
  elseif period == nil then bad = 'period'
  elseif n == nil or (n > limit and not alg.counts_refused) then bad = 'n'
  elseif alg.max_limit ~= nil and limit > alg.max_limit then bad = 'limit'
  end
  if bad then return redis.error_reply('ERR hybridrate: bad ' .. bad .. ' for rule ' .. i) end
  rules[i] = {alg = alg, k = k, limit = limit, period = period, n = n, now = now, max_wait = max_wait}
  k = k + alg.nkeys
end
if k - 1 ~= #KEYS then
  return redis.error_reply('ERR hybridrate: bad key count: want ' .. (k - 1) .. ', got ' .. #KEYS)
end
local seen = {}
for _, key in ipairs(KEYS) do
  if seen[key] then return redis.error_reply('ERR hybridrate: bad key: repeated') end
  seen[key] = true
end

-- Check every rule before any of them consumes.
local all = 1
local oks, waits = {}, {}
for i, r in ipairs(rules) do
  r.alg.load(r)
  local ok, wait = r.alg.check(r)
  oks[i], waits[i] = ok, wait
  if not ok then all = 0 end
end

local out = {all}
for i, r in ipairs(rules) do
  if all == 1 or r.alg.counts_refused then r.alg.take(r) end
  local remaining, reset = r.alg.view(r)
  if remaining < 0 and not r.alg.counts_refused then remaining = 0 end
  if remaining < -1e15 then remaining = -1e15 end
  out[#out + 1] = oks[i] and 1 or 0
  out[#out + 1] = remaining
  out[#out + 1] = waits[i]
  out[#out + 1] = math.min(reset, 1e15)
end
return out
