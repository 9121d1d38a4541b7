-- Shared prelude, prepended to every frontier script by crawld.frontier.
--
-- KEYS (every script; order = crawld.keys.SHARD_KEY_NAMES):
--   1 queue     zset  members "pkey \31 seq \31 attempts \31 payload", score 0
--   2 sched     zset  pkey -> next allowed fetch time (microseconds, Redis TIME)
--   3 gcra      hash  pkey -> GCRA theoretical arrival time (microseconds)
--   4 inflight  hash  pkey -> fetches holding an in-flight slot
--   5 claimed   zset  token -> visibility deadline (microseconds)
--   6 claims    hash  token -> state .. "pkey \31 attempts \31 mode \31 payload";
--                     state is "c" while the fetch holds an in-flight slot of
--                     its pkey, "f" once the slot is released (or never held);
--                     mode is "" for a fetch, else why the URL is recorded
--                     without one (a skip reason)
--   7 seen      hash  layout of the dedup structure of fingerprints ever
--                     queued for fetching (see push.lua, crawld/dedup.py)
--   8 dead      list  dead-lettered entries (JSON)
--   9 stats     hash  counters
--  10 seq       string counter for queue order and claim tokens
--  11 skips     list  "reason \31 attempts \31 payload": URLs recorded without
--                     a fetch
--  12 skipseen  hash  the same for fingerprints ever pushed to skips
--  13 rates     hash  pkey -> emission interval (us) slower than ARGV[1]
--  14 fails     hash  pkey -> failures in a row
--  15 parked    hash  pkey -> why it was given up
--  16 budget    hash  host -> URLs queued
--  17 variants  hash  host+path -> distinct queries queued
--  18 robots    hash  (not used by scripts)
--  19 lease     string token of the worker serving this shard
--
-- ARGV[1..3], every script (the crawl's politeness settings):
--   1 T0   default GCRA emission interval = 1e6 / max_rps_per_host (us)
--   2 BM1  burst - 1 (GCRA tolerance tau = BM1 * T)
--   3 CAP  per-pkey in-flight cap
-- Script-specific arguments start at ARGV[4].
--
-- GCRA is the virtual scheduling algorithm of ITU-T I.371: a request at
-- time t conforms when t >= TAT - tau; then TAT = max(TAT, t) + T.
-- Time always comes from the server (TIME), never from a worker's clock.
local SEP = '\31'
local T0 = tonumber(ARGV[1])
local BM1 = tonumber(ARGV[2])
local CAP = tonumber(ARGV[3])

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- emission interval and tolerance of a pkey (Crawl-delay may slow it down)
local function interval(pkey)
  local T = tonumber(redis.call('HGET', KEYS[13], pkey) or T0)
  if T < T0 then T = T0 end
  return T, BM1 * T
end

-- first queued member of a politeness key, or nil
local function first_of(pkey)
  local r = redis.call('ZRANGEBYLEX', KEYS[1], '[' .. pkey .. SEP, '(' .. pkey .. '\32', 'LIMIT', 0, 1)
  return r[1]
end

-- earliest time pkey may be fetched (TAT - tau), never before now
local function allowed_at(pkey, now)
  local _, tau = interval(pkey)
  local tat = tonumber(redis.call('HGET', KEYS[3], pkey) or 0)
  local t = tat - tau
  if t < now then t = now end
  return t
end

-- put pkey on the schedule if it has queued entries and is under its
-- in-flight cap (a pkey at its cap is "parked": off the schedule until an
-- ack, nack, reclaim or finished fetch frees a slot); a given-up pkey is
-- always due: its entries are handed out as rows to record, not fetched
local function schedule(pkey, now)
  if not first_of(pkey) then return end
  if redis.call('HEXISTS', KEYS[15], pkey) == 1 then
    redis.call('ZADD', KEYS[2], 'NX', now, pkey)
    return
  end
  local inflight = tonumber(redis.call('HGET', KEYS[4], pkey) or 0)
  if inflight < CAP then
    redis.call('ZADD', KEYS[2], 'NX', allowed_at(pkey, now), pkey)
  end
end

-- push pkey's next allowed time back to at least `t` (backoff)
local function hold_until(pkey, t, now)
  local _, tau = interval(pkey)
  local tat = tonumber(redis.call('HGET', KEYS[3], pkey) or 0)
  if tat < t + tau then
    redis.call('HSET', KEYS[3], pkey, t + tau)
  end
  if redis.call('ZSCORE', KEYS[2], pkey) then
    redis.call('ZADD', KEYS[2], 'GT', t, pkey)
  end
end

-- apply a host outcome reported by a worker (see claim.lua for the codes;
-- value: jitter for "f", microseconds for "r" and "h"); backoff_base and
-- backoff_max in microseconds
local function host_outcome(pkey, code, value, reason, now, backoff_base, backoff_max, max_failures)
  if code == 'o' then
    redis.call('HDEL', KEYS[14], pkey)
  elseif code == 'h' then
    if redis.call('HEXISTS', KEYS[15], pkey) == 0 then  -- a given-up host stays due
      hold_until(pkey, now + value, now)
    end
  elseif redis.call('HEXISTS', KEYS[15], pkey) == 0 then
    local fails = redis.call('HINCRBY', KEYS[14], pkey, 1)
    local delay = value
    if code == 'f' then
      delay = backoff_base * 2 ^ (fails - 1)
      if delay > backoff_max then delay = backoff_max end
      delay = delay * (0.5 + value / 2)
    end
    if fails >= max_failures or code == 'p' then
      redis.call('HSET', KEYS[15], pkey, reason)
      redis.call('HINCRBY', KEYS[9], 'parked', 1)
      if first_of(pkey) then redis.call('ZADD', KEYS[2], now, pkey) end
    else
      hold_until(pkey, now + delay, now)
    end
  end
end

local function free_slot(pkey)
  if redis.call('HINCRBY', KEYS[4], pkey, -1) <= 0 then
    redis.call('HDEL', KEYS[4], pkey)
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
