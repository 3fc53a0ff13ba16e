-- sliding_log.lua: the sliding window log, an algorithm of strict.lua (spliced in by package central;
-- not a script on its own).
--
-- Model: exact. Every admitted request is recorded with its time; a request of cost n is allowed when
-- the costs recorded in the last `period` µs plus n are at most `limit`. No boundary burst and no
-- estimate, at the price of memory and work proportional to the requests in the window.
--
-- Weighted cost: one sorted-set member per admitted request (not per unit), so a request of cost 50
-- costs one member, and a running sum of the recorded costs in a companion hash:
-- KEYS[1]  sorted set: score = admission time in µs (exact: below 2^53), member = "<seq>:<n>", where
--          seq is unique per key (from the hash) and n is the request's cost
-- KEYS[2]  hash: s = sum of the costs of the members in KEYS[1], q = last seq handed out
-- Members whose time is ≤ now − period have left the window; they are trimmed (and subtracted from s)
-- when the next request is admitted. A denial reads only, and writes nothing.
-- TTL: both keys live one period past the newest member, refreshed on every write.
-- wait_us when denied: walking the members from the oldest, the time at which enough cost has left the
-- window for n to fit (oldest time + period − now), exact to the µs; reset_us: until the newest member
-- leaves the window. The limit is capped (Go: MaxSlidingLogLimit) because a key may hold that many members.

A.sl = {nkeys = 2, max_limit = 100000}

-- sl_cost reads the cost of a member "<seq>:<n>".
local function sl_cost(m)
  return tonumber(string.match(m, ':(%d+)$')) or 0
end

function A.sl.load(r)
  local z, h = KEYS[r.k], KEYS[r.k + 1]
  r.cutoff = r.now - r.period
  r.sum, r.trim, r.newest, r.reseq = 0, 0, -1, nil
  local newest = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if #newest == 0 then return end -- an empty log, whatever the hash says
  r.newest = tonumber(newest[2])
  local sum = tonumber(redis.call('HGET', h, 's'))
  if sum == nil or sum ~= sum then
    -- The hash was lost (evicted?) but not the log: recount it, and hand out seqs above its largest.
    sum, r.reseq = 0, 0
    for _, m in ipairs(redis.call('ZRANGE', z, 0, -1)) do
      sum = sum + sl_cost(m)
      r.reseq = math.max(r.reseq, tonumber(string.match(m, '^(%d+):')) or 0)
    end
  end
  local old = redis.call('ZRANGEBYSCORE', z, '-inf', string.format('%.17g', r.cutoff))
  r.trim = #old
  for _, m in ipairs(old) do sum = sum - sl_cost(m) end
  if sum < 0 then sum = 0 end
  r.sum = sum
end

function A.sl.check(r)
  local free = r.sum + r.n - r.limit -- cost that has to leave the window first
  if free <= 0 then return true, 0 end
  local z = KEYS[r.k]
  local lo = '(' .. string.format('%.17g', r.cutoff)
  local offset = 0
  while true do
    local ms = redis.call('ZRANGEBYSCORE', z, lo, '+inf', 'WITHSCORES', 'LIMIT', offset, 128)
    if #ms == 0 then break end
    for j = 1, #ms, 2 do
      free = free - sl_cost(ms[j])
      if free <= 0 then
        local wait = tonumber(ms[j + 1]) + r.period - r.now
        if wait < 1 then wait = 1 end
        return false, wait
      end
    end
    offset = offset + #ms / 2
  end
  return false, r.period -- unreachable while the sum matches the set
end

function A.sl.take(r)
  local z, h = KEYS[r.k], KEYS[r.k + 1]
  if r.trim > 0 then
    redis.call('ZREMRANGEBYSCORE', z, '-inf', string.format('%.17g', r.cutoff))
  end
  if r.reseq then redis.call('HSET', h, 'q', r.reseq) end
  local seq = redis.call('HINCRBY', h, 'q', 1)
  redis.call('ZADD', z, string.format('%.17g', r.now), string.format('%d:%d', seq, r.n))
  r.sum = r.sum + r.n
  redis.call('HSET', h, 's', r.sum)
  if r.now > r.newest then r.newest = r.now end
  local life = r.newest + r.period - r.now
  ttl(z, life)
  ttl(h, life)
end

function A.sl.view(r)
  local reset = 0
  if r.sum > 0 and r.newest >= 0 then reset = math.max(0, r.newest + r.period - r.now) end
  return r.limit - r.sum, reset
end
