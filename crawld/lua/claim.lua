-- claim: take up to n entries whose politeness key may be fetched now.
--
-- Walks the schedule in time order; for each due pkey applies GCRA
-- (ITU-T I.371 virtual scheduling: conforming when now >= TAT - tau, then
-- TAT = max(TAT, now) + T) and the in-flight cap, pops the pkey's oldest
-- entry and records a claim with a visibility deadline.
--
-- ARGV[1] n    most entries to claim
-- ARGV[2] T    GCRA emission interval = 1e6 / max_rps (microseconds)
-- ARGV[3] tau  GCRA tolerance = (burst - 1) * T (microseconds)
-- ARGV[4] cap  per-pkey in-flight cap
-- ARGV[5] vt   visibility timeout (microseconds)
-- ARGV[6..]    tokens whose fetch is over: their in-flight slots are given
--              back first (see fetch_done in _lib.lua)
-- Returns {wait_us, token1, attempts1, payload1, token2, ...}; wait_us is
-- the time until the next scheduled pkey is due (-1: nothing scheduled).
local now = now_us()
local n = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
local tau = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local vt = tonumber(ARGV[5])
for i = 6, #ARGV do
  local pkey = fetch_done(ARGV[i])
  if pkey then schedule(pkey, now, tau, cap) end
end
local out = {0}
local got, steps = 0, 0
while got < n and steps < 4 * n + 16 do
  steps = steps + 1
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)
  local pkey = due[1]
  if not pkey then break end
  local tat = tonumber(redis.call('HGET', KEYS[3], pkey) or 0)
  if tat < now then tat = now end
  local inflight = tonumber(redis.call('HGET', KEYS[4], pkey) or 0)
  local member = first_of(pkey)
  if tat - tau > now then
    redis.call('ZADD', KEYS[2], tat - tau, pkey)    -- not conforming yet
  elseif inflight >= cap or not member then
    redis.call('ZREM', KEYS[2], pkey)               -- park, or nothing queued
  else
    redis.call('ZREM', KEYS[1], member)
    local p2 = string.find(member, SEP, #pkey + 2, true)
    local p3 = string.find(member, SEP, p2 + 1, true)
    local attempts = tonumber(string.sub(member, p2 + 1, p3 - 1)) + 1
    local payload = string.sub(member, p3 + 1)
    tat = tat + T
    redis.call('HSET', KEYS[3], pkey, tat)
    inflight = redis.call('HINCRBY', KEYS[4], pkey, 1)
    local token = tostring(redis.call('INCR', KEYS[10]))
    redis.call('ZADD', KEYS[5], now + vt, token)
    redis.call('HSET', KEYS[6], token, 'c' .. pkey .. SEP .. attempts .. SEP .. payload)
    if inflight < cap and first_of(pkey) then
      redis.call('ZADD', KEYS[2], tat - tau, pkey)
    else
      redis.call('ZREM', KEYS[2], pkey)
    end
    out[#out + 1] = token
    out[#out + 1] = attempts
    out[#out + 1] = payload
    got = got + 1
  end
end
if got > 0 then redis.call('HINCRBY', KEYS[9], 'claimed', got) end
local nxt = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if nxt[2] then
  local w = tonumber(nxt[2]) - now
  if w < 0 then w = 0 end
  out[1] = math.floor(w)
else
  out[1] = -1
end
return out
