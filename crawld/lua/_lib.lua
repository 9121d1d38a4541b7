-- Shared prelude, prepended to every frontier script by crawld.frontier.
--
-- KEYS (every script; order = crawld.keys.SHARD_KEY_NAMES):
--   1 queue     zset  members "pkey \31 seq \31 attempts \31 payload", score 0
--   2 sched     zset  pkey -> next allowed fetch time (microseconds, Redis TIME)
--   3 gcra      hash  pkey -> GCRA theoretical arrival time (microseconds)
--   4 inflight  hash  pkey -> claimed, not yet acked
--   5 claimed   zset  token -> visibility deadline (microseconds)
--   6 claims    hash  token -> state .. "pkey \31 attempts \31 payload"; state
--                     is "c" while the fetch holds an in-flight slot of its
--                     pkey, "f" once the fetch is done and the slot released
--   7 seen      set   fingerprints ever pushed
--   8 dead      list  dead-lettered entries (JSON)
--   9 stats     hash  counters
--  10 seq       string counter for queue order and claim tokens
--
-- Time always comes from the server (TIME), never from a worker's clock.
local SEP = '\31'

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- first queued member of a politeness key, or nil
local function first_of(pkey)
  local r = redis.call('ZRANGEBYLEX', KEYS[1], '[' .. pkey .. SEP, '(' .. pkey .. '\32', 'LIMIT', 0, 1)
  return r[1]
end

-- earliest time pkey may be fetched by GCRA: TAT - tau (ITU-T I.371 virtual
-- scheduling algorithm), never before now
local function allowed_at(pkey, now, tau)
  local tat = tonumber(redis.call('HGET', KEYS[3], pkey) or 0)
  local t = tat - tau
  if t < now then t = now end
  return t
end

-- put pkey on the schedule if it has queued entries and is under its
-- in-flight cap (a pkey at its cap is "parked": off the schedule until an
-- ack, nack or reclaim frees a slot)
local function schedule(pkey, now, tau, cap)
  local inflight = tonumber(redis.call('HGET', KEYS[4], pkey) or 0)
  if inflight < cap and first_of(pkey) then
    redis.call('ZADD', KEYS[2], 'NX', allowed_at(pkey, now, tau), pkey)
  end
end

local function free_slot(pkey)
  if redis.call('HINCRBY', KEYS[4], pkey, -1) <= 0 then
    redis.call('HDEL', KEYS[4], pkey)
  end
end

-- split a claims-hash value into state, pkey, attempts, payload
local function parse_claim(c)
  local p1 = string.find(c, SEP, 2, true)
  local p2 = string.find(c, SEP, p1 + 1, true)
  return string.sub(c, 1, 1), string.sub(c, 2, p1 - 1),
    tonumber(string.sub(c, p1 + 1, p2 - 1)), string.sub(c, p2 + 1)
end

-- drop a claim; returns pkey, attempts, payload or nil when the token is
-- not claimed (acked already, or reclaimed)
local function release(token)
  if redis.call('ZREM', KEYS[5], token) == 0 then
    return nil
  end
  local c = redis.call('HGET', KEYS[6], token)
  redis.call('HDEL', KEYS[6], token)
  if not c then
    return nil
  end
  local state, pkey, attempts, payload = parse_claim(c)
  if state == 'c' then
    free_slot(pkey)
  end
  return pkey, attempts, payload
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
  local state, pkey = parse_claim(c)
  free_slot(pkey)
  return pkey
end

-- queue an entry (again) at the back of its pkey's queue
local function enqueue(pkey, attempts, payload)
  local seq = redis.call('INCR', KEYS[10])
  redis.call('ZADD', KEYS[1], 0, pkey .. SEP .. string.format('%015d', seq) .. SEP .. attempts .. SEP .. payload)
end

-- at_us is written as a string: Redis' cjson keeps only 14 significant
-- digits of a number, and a microsecond timestamp has 16
local function dead_letter(pkey, attempts, payload, reason, now)
  redis.call('RPUSH', KEYS[8], cjson.encode({v = 1, pkey = pkey, attempts = attempts,
    payload = payload, reason = reason, at_us = string.format('%d', now)}))
  redis.call('HINCRBY', KEYS[9], 'dead', 1)
end
