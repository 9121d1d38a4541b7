-- claim: take up to n entries to work on: first URLs to record without a
-- fetch (skips, and the queues of given-up hosts), then URLs whose
-- politeness key is due.  For a due pkey it applies GCRA and the in-flight
-- cap, pops the pkey's oldest entry and records a claim with a visibility
-- deadline.  Before claiming it applies what the worker reports about
-- finished fetches: slots to give back and host outcomes (backoff, parking).
--
-- ARGV[4] lease      the caller's lease token ("" = no lease check); if the
--                    shard's lease is held by another token, nothing is
--                    claimed and wait_us is -2 (fencing: a worker that lost
--                    its lease cannot claim)
-- ARGV[5] n          most entries to claim
-- ARGV[6] vt         visibility timeout (microseconds)
-- ARGV[7] nf         number of tokens that follow, whose fetch is over
-- ARGV[8 .. 7+nf]    those tokens (their in-flight slots are given back)
-- then groups of 4, host outcomes: pkey, code, value, reason
--     code "o": success, the pkey's failure count is reset
--     code "f": failure; value = jitter in [0, 1); back off
--               backoff_base * 2^(failures-1), at most backoff_max, scaled
--               by (0.5 + value / 2) ("equal jitter")
--     code "r": Retry-After; value = delay in microseconds
--     code "p": give the host up now (e.g. Retry-After beyond the limit)
--     code "h": hold the host for value microseconds, not a failure
--               (robots.txt unreachable: its own failure count applies)
--     a pkey failing max_failures times in a row is given up ("parked"):
--     its URLs are then handed out as rows to record, not fetched
-- the host-outcome group is preceded by 3 settings:
--     backoff_base_us, backoff_max_us, max_failures
-- Returns {wait_us, token1, attempts1, mode1, payload1, token2, ...};
-- wait_us is the time until the next scheduled pkey is due (-1: nothing
-- scheduled).
local now = now_us()
local n = tonumber(ARGV[5])
local vt = tonumber(ARGV[6])
local nf = tonumber(ARGV[7])
for i = 8, 7 + nf do
  local pkey = fetch_done(ARGV[i])
  if pkey then schedule(pkey, now) end
end
local base = 8 + nf
local backoff_base, backoff_max, max_failures = tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
for i = base + 3, #ARGV, 4 do
  host_outcome(ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], now, backoff_base, backoff_max,
    max_failures)
end

local out = {0}
local got = 0
if ARGV[4] ~= '' and redis.call('GET', KEYS[19]) ~= ARGV[4] then
  return {-2}
end
-- 1. URLs to record without fetching
if n > 0 then
  local skips = redis.call('LPOP', KEYS[11], n)
  if skips then
    for _, s in ipairs(skips) do
      local p1 = string.find(s, SEP, 1, true)
      local p2 = string.find(s, SEP, p1 + 1, true)
      local mode, payload = string.sub(s, 1, p1 - 1), string.sub(s, p2 + 1)
      local attempts = tonumber(string.sub(s, p1 + 1, p2 - 1)) + 1
      out[#out + 1] = new_claim('f', '', attempts, mode, payload, now + vt)
      out[#out + 1] = attempts
      out[#out + 1] = mode
      out[#out + 1] = payload
      got = got + 1
    end
  end
end
-- 2. due politeness keys
local steps = 0
while got < n and steps < 4 * n + 16 do
  steps = steps + 1
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)
  local pkey = due[1]
  if not pkey then break end
  local member = first_of(pkey)
  local parked = redis.call('HGET', KEYS[15], pkey)
  if not member then
    redis.call('ZREM', KEYS[2], pkey)
  elseif parked then
    -- a given-up host: hand its URLs out as rows to record, no fetch
    redis.call('ZREM', KEYS[1], member)
    local p2 = string.find(member, SEP, #pkey + 2, true)
    local p3 = string.find(member, SEP, p2 + 1, true)
    local attempts = tonumber(string.sub(member, p2 + 1, p3 - 1)) + 1
    local payload = string.sub(member, p3 + 1)
    local mode = 'host_parked: ' .. parked
    out[#out + 1] = new_claim('f', pkey, attempts, mode, payload, now + vt)
    out[#out + 1] = attempts
    out[#out + 1] = mode
    out[#out + 1] = payload
    got = got + 1
    if not first_of(pkey) then redis.call('ZREM', KEYS[2], pkey) end
  else
    local T, tau = interval(pkey)
    local tat = tonumber(redis.call('HGET', KEYS[3], pkey) or 0)
    if tat < now then tat = now end
    local inflight = tonumber(redis.call('HGET', KEYS[4], pkey) or 0)
    if tat - tau > now then
      redis.call('ZADD', KEYS[2], tat - tau, pkey)    -- not conforming yet
    elseif inflight >= CAP then
      redis.call('ZREM', KEYS[2], pkey)               -- park until a slot frees
    else
      redis.call('ZREM', KEYS[1], member)
      local p2 = string.find(member, SEP, #pkey + 2, true)
      local p3 = string.find(member, SEP, p2 + 1, true)
      local attempts = tonumber(string.sub(member, p2 + 1, p3 - 1)) + 1
      local payload = string.sub(member, p3 + 1)
      tat = tat + T
      redis.call('HSET', KEYS[3], pkey, tat)
      inflight = redis.call('HINCRBY', KEYS[4], pkey, 1)
      out[#out + 1] = new_claim('c', pkey, attempts, '', payload, now + vt)
      out[#out + 1] = attempts
      out[#out + 1] = ''
      out[#out + 1] = payload
      got = got + 1
      if inflight < CAP and first_of(pkey) then
        redis.call('ZADD', KEYS[2], tat - tau, pkey)
      else
        redis.call('ZREM', KEYS[2], pkey)
      end
    end
  end
end
if got > 0 then redis.call('HINCRBY', KEYS[9], 'claimed', got) end
if redis.call('LLEN', KEYS[11]) > 0 then
  out[1] = 0
else
  local nxt = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if nxt[2] then
    local w = tonumber(nxt[2]) - now
    if w < 0 then w = 0 end
    out[1] = math.floor(w)
  else
    out[1] = -1
  end
end
return out
