-- Shared prelude, prepended to every frontier script by crawld.frontier.
--
-- KEYS (every script; order = crawld.keys.SHARD_KEY_NAMES).  (c) = this
-- crawl's key on the shard; (s) = shared by every crawl on this shard
-- number: the politeness state of the registered domains the shard owns,
-- one per domain for the whole fleet (crawld.keys).
--   1 queue     (c) zset  members "pkey \31 seq \31 attempts \31 payload", score 0
--   2 sched     (c) zset  pkey -> next time this crawl may claim it (us, Redis TIME)
--   3 gcra      (s) hash  pkey -> GCRA theoretical arrival time (us)
--   4 inflight  (s) hash  pkey -> fetches holding an in-flight slot, every crawl's
--   5 claimed   (c) zset  token -> visibility deadline (us)
--   6 claims    (c) hash  token -> state .. "pkey \31 attempts \31 mode \31 payload";
--                         state is "c" while the fetch holds an in-flight slot of
--                         its pkey, "f" once the slot is released (or never held);
--                         mode is "" for a fetch, else why the URL is recorded
--                         without one (a skip reason)
--   7 seen      (c) hash  layout of the dedup structure of fingerprints ever
--                         queued for fetching (see push.lua, crawld/dedup.py)
--   8 dead      (c) list  dead-lettered entries (JSON)
--   9 stats     (c) hash  counters
--  10 seq       (c) string counter for queue order and claim tokens
--  11 skips     (c) list  "reason \31 attempts \31 payload": URLs recorded without
--                         a fetch
--  12 skipseen  (c) hash  the same for fingerprints ever pushed to skips
--  13 rates     (s) hash  pkey -> emission interval (us) of its Crawl-delay
--  14 fails     (s) hash  pkey -> "failures in a row:first failure (us)"
--  15 parked    (s) hash  pkey -> "until (us)|why": given up until then
--  16 budget    (c) hash  host -> URLs queued
--  17 variants  (c) hash  host+path -> distinct queries queued
--  18 robots    (s) hash  (not used by scripts)
--  19 lease     (c) string token of the worker serving this shard
--  20 adapt     (s) hash  pkey -> "interval:ceiling:cut_at" (us) after 429/503
--  21 want      (s) hash  pkey -> KEYS[1] of a crawl waiting for its turn;
--                         pkey SEP -> KEYS[1] of the crawl that claimed last
--  22 floor     (s) hash  pkey -> "interval:until" (us), the slowest crawl's
--
-- ARGV[1..3], every script (the calling crawl's politeness settings):
--   1 T0   its GCRA emission interval = 1e6 / max_rps_per_host (us)
--   2 BM1  burst - 1 (GCRA tolerance tau = BM1 * T)
--   3 CAP  per-pkey in-flight cap
-- Script-specific arguments start at ARGV[4].
--
-- GCRA is the virtual scheduling algorithm of ITU-T I.371: a request at
-- time t conforms when t >= TAT - tau; then TAT = max(TAT, t) + T.  The
-- interval T in force, the adaptation after 429/503 and the fair share
-- between crawls are crawld/politeness.py's functions of the same names,
-- mirrored here (tests/test_politeness_math.py runs both on one table).
-- Time always comes from the server (TIME), never from a worker's clock.
-- Numbers written into strings go through string.format('%d'): Lua's
-- tostring keeps only 14 significant digits, a microsecond time has 16.
local SEP = '\31'
local T0 = tonumber(ARGV[1])
local BM1 = tonumber(ARGV[2])
local CAP = tonumber(ARGV[3])
-- crawld/politeness.py constants
local FIRST_CUT_US = 1000000
local CUT_FACTOR = 2
local K_FAST = 32
local K_PROBE = 4000
local PROBE_MARGIN = 1.15
local FLOOR_HOLD_US = 60000000

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function fmt(x)
  return string.format('%d', x)
end

-- a pkey's adaptation: interval, ceiling, cut_at (us), or nil
local function adapt_get(pkey)
  local a = redis.call('HGET', KEYS[20], pkey)
  if not a then return nil end
  local i, c, t = string.match(a, '^(%d+):(%d+):(%d+)$')
  if not i then return nil end
  return tonumber(i), tonumber(c), tonumber(t)
end

-- politeness.interval: the emission interval in force for a claim by this
-- crawl, its tolerance tau, and the stored floor (for renew_floor)
local function interval(pkey, now)
  local T = T0
  local r = redis.call('HGET', KEYS[13], pkey)
  if r and tonumber(r) > T then T = tonumber(r) end
  local ai = adapt_get(pkey)
  if ai and ai > T then T = ai end
  local f = redis.call('HGET', KEYS[22], pkey)
  if f then
    local fi, fu = string.match(f, '^(%d+):(%d+)$')
    if fi and tonumber(fu) > now and tonumber(fi) > T then T = tonumber(fi) end
  end
  return T, BM1 * T, f
end

-- politeness.next_floor: after a claim by this crawl, keep the floor at the
-- slowest live crawl's interval; f is the stored floor as interval() read it
local function renew_floor(pkey, now, f)
  local hold = 3 * T0
  if hold < FLOOR_HOLD_US then hold = FLOOR_HOLD_US end
  if f then
    local fi, fu = string.match(f, '^(%d+):(%d+)$')
    if fi then
      fi, fu = tonumber(fi), tonumber(fu)
      if fu > now and fi > T0 then return end
      if fi == T0 and fu - now > math.floor(hold / 2) then return end
    end
  end
  redis.call('HSET', KEYS[22], pkey, fmt(T0) .. ':' .. fmt(now + hold))
end

-- first queued member of a politeness key, or nil
local function first_of(pkey)
  local r = redis.call('ZRANGEBYLEX', KEYS[1], '[' .. pkey .. SEP, '(' .. pkey .. '\32', 'LIMIT', 0, 1)
  return r[1]
end

-- earliest time pkey may be fetched (TAT - tau), never before now
local function allowed_at(pkey, now)
  local _, tau = interval(pkey, now)
  local tat = tonumber(redis.call('HGET', KEYS[3], pkey) or 0)
  local t = tat - tau
  if t < now then t = now end
  return t
end

-- failures in a row of pkey, and the time of the first (0, nil: none)
local function fails_of(pkey)
  local f = redis.call('HGET', KEYS[14], pkey)
  if not f then return 0, nil end
  local n, since = string.match(f, '^(%d+):(%d+)$')
  if not n then return tonumber(f) or 0, nil end
  return tonumber(n), tonumber(since)
end

-- why pkey is given up, or nil; a give-up that has run out is lifted
-- (the host is tried afresh)
local function parked_reason(pkey, now)
  local p = redis.call('HGET', KEYS[15], pkey)
  if not p then return nil end
  local until_us, why = string.match(p, '^(%d+)|(.*)$')
  if until_us and tonumber(until_us) <= now then
    redis.call('HDEL', KEYS[15], pkey)
    redis.call('HDEL', KEYS[14], pkey)
    return nil
  end
  return why or p
end

-- the in-flight cap of pkey: CAP, or 1 (probes) while it keeps failing
local function cap_of(pkey, max_failures)
  if max_failures and max_failures > 0 then
    local n = fails_of(pkey)
    if n >= max_failures then return 1 end
  end
  return CAP
end

-- put pkey on this crawl's schedule if it has queued entries: at the time
-- it conforms (ZADD LT: never later than it is); at its in-flight cap it
-- stays off the schedule until this crawl's own ack or finished fetch
-- frees a slot, unless other crawls hold slots (their fetches do not
-- reschedule this crawl's keys): then it looks again an interval later (at
-- least 250 ms); a given-up pkey is always due: its entries are handed out
-- as rows to record, not fetched
local function schedule(pkey, now)
  if not first_of(pkey) then return end
  if redis.call('HEXISTS', KEYS[15], pkey) == 1 then
    redis.call('ZADD', KEYS[2], 'LT', now, pkey)
    return
  end
  local inflight = tonumber(redis.call('HGET', KEYS[4], pkey) or 0)
  if inflight < CAP then
    redis.call('ZADD', KEYS[2], 'LT', allowed_at(pkey, now), pkey)
  elseif not redis.call('ZSCORE', KEYS[2], pkey) and
      tonumber(redis.call('HGET', KEYS[4], pkey .. SEP .. KEYS[1]) or 0) < inflight then
    -- at the cap with slots held by other crawls: look again later
    local T = interval(pkey, now)
    if T < 250000 then T = 250000 end
    redis.call('ZADD', KEYS[2], now + T, pkey)
  end
end

-- push pkey's next allowed time back to at least `t` (a hold)
local function hold_until(pkey, t, now)
  local _, tau = interval(pkey, now)
  local tat = tonumber(redis.call('HGET', KEYS[3], pkey) or 0)
  if tat < t + tau then
    redis.call('HSET', KEYS[3], pkey, t + tau)
  end
  if redis.call('ZSCORE', KEYS[2], pkey) then
    redis.call('ZADD', KEYS[2], 'GT', t, pkey)
  end
end

-- politeness.on_slowdown; returns the interval now in force
local function slow_down(pkey, now, max_interval, told)
  local current = interval(pkey, now)
  local ai, ac, at = adapt_get(pkey)
  if ai and now - at < current then return current end
  local new = CUT_FACTOR * current
  if not ai and not told and new < FIRST_CUT_US then new = FIRST_CUT_US end
  local cap = max_interval
  if cap < current then cap = current end
  if new > cap then new = cap end
  redis.call('HSET', KEYS[20], pkey, fmt(new) .. ':' .. fmt(current) .. ':' .. fmt(now))
  redis.call('HINCRBY', KEYS[9], 'rate_cuts', 1)
  return new
end

-- politeness.on_success
local function speed_up(pkey)
  local ai, ac, at = adapt_get(pkey)
  if not ai then return end
  local k = K_FAST
  if ai <= PROBE_MARGIN * ac then k = K_PROBE end
  local new = ai - math.floor(ai / k)
  if new <= T0 then
    redis.call('HDEL', KEYS[20], pkey)
  else
    redis.call('HSET', KEYS[20], pkey, fmt(new) .. ':' .. fmt(ac) .. ':' .. fmt(at))
  end
end

local function give_up(pkey, until_us, reason, now)
  redis.call('HSET', KEYS[15], pkey, fmt(until_us) .. '|' .. reason)
  redis.call('HINCRBY', KEYS[9], 'parked', 1)
  if first_of(pkey) then redis.call('ZADD', KEYS[2], now, pkey) end
end

-- apply a host outcome reported by a worker (the codes are listed in
-- claim.lua); s = {backoff_base_us, backoff_max_us, max_failures, give_up_us}
local function host_outcome(pkey, code, value, reason, now, s)
  if code == 'o' then
    redis.call('HDEL', KEYS[14], pkey)
    speed_up(pkey)
  elseif code == 'h' then
    if redis.call('HEXISTS', KEYS[15], pkey) == 0 then  -- a given-up host stays due
      hold_until(pkey, now + value, now)
    end
  elseif code == 'p' then
    if redis.call('HEXISTS', KEYS[15], pkey) == 0 then give_up(pkey, now + value, reason, now) end
  elseif code == 'a' or code == 'r' then
    -- 429/503: slower, not broken; Retry-After ('r') holds at least that long
    if redis.call('HEXISTS', KEYS[15], pkey) == 0 then
      local T = slow_down(pkey, now, s[2], code == 'r')
      local hold = T
      if code == 'r' and value > hold then hold = value end
      hold_until(pkey, now + hold, now)
    end
  elseif redis.call('HEXISTS', KEYS[15], pkey) == 0 then
    -- 'f': a failure (5xx, connection, time-out); value = jitter in [0, 1)
    local n, since = fails_of(pkey)
    n = n + 1
    if not since then since = now end
    redis.call('HSET', KEYS[14], pkey, fmt(n) .. ':' .. fmt(since))
    if s[4] > 0 and now - since >= s[4] then
      give_up(pkey, now + s[4], reason, now)
    else
      local delay = s[1] * 2 ^ (n - 1)
      if delay > s[2] then delay = s[2] end
      delay = delay * (0.5 + value / 2)
      hold_until(pkey, now + delay, now)
    end
  end
end

-- in-flight slots: field pkey counts every crawl's, field pkey SEP KEYS[1]
-- this crawl's (so a crawl at the cap knows whether its own acks will
-- reschedule the key, or another crawl holds slots and it must look again)
local function take_slot(pkey)
  redis.call('HINCRBY', KEYS[4], pkey .. SEP .. KEYS[1], 1)
  return redis.call('HINCRBY', KEYS[4], pkey, 1)
end

local function free_slot(pkey)
  if redis.call('HINCRBY', KEYS[4], pkey, -1) <= 0 then
    redis.call('HDEL', KEYS[4], pkey)
  end
  local mine = pkey .. SEP .. KEYS[1]
  if redis.call('HINCRBY', KEYS[4], mine, -1) <= 0 then
    redis.call('HDEL', KEYS[4], mine)
  end
end

-- this crawl's slots in flight of pkey
local function own_slots(pkey)
  return tonumber(redis.call('HGET', KEYS[4], pkey .. SEP .. KEYS[1]) or 0)
end

-- at the in-flight cap: if every slot is this crawl's, its own acks put the
-- key back on its schedule; else another crawl's fetch frees the slot and
-- this crawl looks again after an interval (at least AT_CAP_POLL_US)
local AT_CAP_POLL_US = 250000
local function park_at_cap(pkey, inflight, now)
  if own_slots(pkey) >= inflight then
    redis.call('ZREM', KEYS[2], pkey)
  else
    local T = interval(pkey, now)
    if T < AT_CAP_POLL_US then T = AT_CAP_POLL_US end
    redis.call('ZADD', KEYS[2], now + T, pkey)
  end
end

-- split a claims-hash value into state, pkey, attempts, mode, payload
local function parse_claim(c)
  local p1 = string.find(c, SEP, 2, true)
  local p2 = string.find(c, SEP, p1 + 1, true)
  local p3 = string.find(c, SEP, p2 + 1, true)
  return string.sub(c, 1, 1), string.sub(c, 2, p1 - 1), tonumber(string.sub(c, p1 + 1, p2 - 1)),
    string.sub(c, p2 + 1, p3 - 1), string.sub(c, p3 + 1)
end

-- record a claim; returns its token
local function new_claim(state, pkey, attempts, mode, payload, deadline)
  local token = tostring(redis.call('INCR', KEYS[10]))
  redis.call('ZADD', KEYS[5], deadline, token)
  redis.call('HSET', KEYS[6], token, state .. pkey .. SEP .. attempts .. SEP .. mode .. SEP .. payload)
  return token
end

-- drop a claim; returns pkey, attempts, mode, payload or nil when the token
-- is not claimed (acked already, or reclaimed)
local function release(token)
  if redis.call('ZREM', KEYS[5], token) == 0 then
    return nil
  end
  local c = redis.call('HGET', KEYS[6], token)
  redis.call('HDEL', KEYS[6], token)
  if not c then
    return nil
  end
  local state, pkey, attempts, mode, payload = parse_claim(c)
  if state == 'c' then
    free_slot(pkey)
  end
  return pkey, attempts, mode, payload
end

-- the fetch of a claim is over: give back its in-flight slot now (the
-- claim itself lasts until the ack, after the row is durable); returns
-- the pkey, or nil if the slot was already given back or the token is gone
local function fetch_done(token)
  local c = redis.call('HGET', KEYS[6], token)
  if not c or string.sub(c, 1, 1) ~= 'c' then
    return nil
  end
  redis.call('HSET', KEYS[6], token, 'f' .. string.sub(c, 2))
  local _, pkey = parse_claim(c)
  free_slot(pkey)
  return pkey
end

-- queue an entry (again) at the back of its pkey's queue; a skip entry
-- (mode ~= '') goes back to the skips list
local function enqueue(pkey, attempts, mode, payload)
  if mode ~= '' then
    redis.call('RPUSH', KEYS[11], mode .. SEP .. attempts .. SEP .. payload)
    return
  end
  local seq = redis.call('INCR', KEYS[10])
  redis.call('ZADD', KEYS[1], 0, pkey .. SEP .. string.format('%015d', seq) .. SEP .. attempts .. SEP .. payload)
end

-- at_us is written as a string: Redis' cjson keeps only 14 significant
-- digits of a number, and a microsecond timestamp has 16
local function dead_letter(pkey, attempts, payload, reason, now, mode)
  redis.call('RPUSH', KEYS[8], cjson.encode({v = 1, pkey = pkey, attempts = attempts, mode = mode or '',
    payload = payload, reason = reason, at_us = string.format('%d', now)}))
  redis.call('HINCRBY', KEYS[9], 'dead', 1)
end
