-- leaky_bucket.lua: the leaky-bucket shaper, an algorithm of strict.lua (spliced in by package central
-- after gcra.lua, whose state and arithmetic it shares; not a script on its own).
--
-- Model: the leaky bucket as a queue. Instead of denying, the shaper books the request into the global
-- schedule and answers how long the caller must wait before the work may run, like x/time/rate's
-- Reserve, but shared by every process: `limit` units may run at once, then one unit per period/limit.
-- A booking that would have to wait longer than ARGV[2] (max wait) is refused and books nothing.
--
-- KEYS: 1, the same string as gcra.lua ("<ts> <d>", d = TAT − ts in µs); TAT may run up to max wait
-- ahead of the GCRA limit.
-- TTL: TAT − now, refreshed on every write.
-- wait_us: when ok, the delay before the work may run (0 within the burst); when refused, the delay
-- the booking would have needed (more than max wait). reset_us: TAT − now.

A.lb = {nkeys = 1, load = A.gcra.load, take = A.gcra.take, view = A.gcra.view}

function A.lb.check(r)
  local delay = r.need - r.period + r.ts - r.now
  local wait = 0
  if delay > tol(r.period) then wait = ceil_us(delay, r.period) end
  return delay <= r.max_wait + tol(r.period), wait
end
