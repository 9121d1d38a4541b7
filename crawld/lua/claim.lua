-- claim: take up to n entries to work on: first URLs to record without a
-- fetch (skips, and the queues of given-up hosts), then URLs whose
-- politeness key is due.  For a due pkey it applies GCRA (the interval in
-- force: this crawl's, Crawl-delay, adaptation, the slowest crawl's floor)
-- and the in-flight cap, both shared by every crawl of the fleet, and the
-- fair share between crawls waiting on the pkey; then pops the pkey's
-- oldest entry and records a claim with a visibility deadline.  Before
-- claiming it applies what the worker reports about finished fetches:
-- slots to give back and host outcomes (backoff, adaptation, give-up).
--
-- ARGV[4] lease      the caller's lease token ("" = no lease check); if the
--                    shard's lease is held by another token, nothing is
--                    claimed and wait_us is -2 (fencing: a worker that lost
--                    its lease cannot claim)
-- ARGV[5] n          most entries to claim
-- ARGV[6] vt         visibility timeout (microseconds)
-- ARGV[7] nf         number of tokens that follow, whose fetch is over
-- ARGV[8 .. 7+nf]    those tokens (their in-flight slots are given back)
-- then 4 settings: backoff_base_us, backoff_max_us, max_failures,
--     give_up_us (0 = never give a failing host up)
-- then groups of 4, host outcomes: pkey, code, value, reason
--     code "o": success: the failure count is reset, the adapted rate
--               creeps back up (crawld.politeness.on_success)
--     code "f": failure (5xx, connection, time-out); value = jitter in
--               [0, 1); hold backoff_base * 2^(failures-1), at most
--               backoff_max, scaled by (0.5 + value / 2) ("equal jitter");
--               max_failures in a row: one request in flight at a time
--               (probes); failing for give_up_us since the first failure
--               of the run: given up ("parked") for give_up_us, its URLs
--               handed out as rows to record, not fetched
--     code "a": 429/503 without Retry-After: slow down (on_slowdown) and
--               hold one new interval; not a failure
--     code "r": 429/503 with Retry-After: the same, holding at least value
--               microseconds
--     code "p": give the host up now for value microseconds (a Retry-After
--               beyond the crawl's limit)
--     code "h": hold the host for value microseconds, not a failure
--               (robots.txt unreachable: its own failure count applies)
-- Returns {wait_us, token1, attempts1, mode1, payload1, interval1, token2, ...}
-- (interval: the emission interval in force for a fetch, us; 0 for a URL
-- to record);
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
local s = {tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])}
for i = base + 4, #ARGV, 4 do
  host_outcome(ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], now, s)
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
    for _, e in ipairs(skips) do
      local p1 = string.find(e, SEP, 1, true)
      local p2 = string.find(e, SEP, p1 + 1, true)
      local mode, payload = string.sub(e, 1, p1 - 1), string.sub(e, p2 + 1)
      local attempts = tonumber(string.sub(e, p1 + 1, p2 - 1)) + 1
      out[#out + 1] = new_claim('f', '', attempts, mode, payload, now + vt)
      out[#out + 1] = attempts
      out[#out + 1] = mode
      out[#out + 1] = payload
      out[#out + 1] = 0
      got = got + 1
    end
  end
end
-- 2. due politeness keys
local function pop(pkey, member)
  redis.call('ZREM', KEYS[1], member)
  local p2 = string.find(member, SEP, #pkey + 2, true)
  local p3 = string.find(member, SEP, p2 + 1, true)
  return tonumber(string.sub(member, p2 + 1, p3 - 1)) + 1, string.sub(member, p3 + 1)
end
local steps = 0
while got < n and steps < 4 * n + 16 do
  steps = steps + 1
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)
  local pkey = due[1]
  if not pkey then break end
  -- the key's first two entries: the one to hand out, and whether another follows
  local two = redis.call('ZRANGEBYLEX', KEYS[1], '[' .. pkey .. SEP, '(' .. pkey .. '\32', 'LIMIT', 0, 2)
  local member, more = two[1], two[2] ~= nil
  local parked = member and parked_reason(pkey, now)
  if not member then
    redis.call('ZREM', KEYS[2], pkey)
  elseif parked then
    -- a given-up host: hand its URLs out as rows to record, no fetch
    local attempts, payload = pop(pkey, member)
    local mode = 'host_parked: ' .. parked
    out[#out + 1] = new_claim('f', pkey, attempts, mode, payload, now + vt)
    out[#out + 1] = attempts
    out[#out + 1] = mode
    out[#out + 1] = payload
    out[#out + 1] = 0
    got = got + 1
    if not more then redis.call('ZREM', KEYS[2], pkey) end
  else
    local T, tau, floor = interval(pkey, now)
    local tat = tonumber(redis.call('HGET', KEYS[3], pkey) or 0)
    if tat < now then tat = now end
    local inflight = tonumber(redis.call('HGET', KEYS[4], pkey) or 0)
    local cap = cap_of(pkey, s[3])
    if tat - tau > now or inflight >= cap then
      -- not conforming yet, or at the cap: wait, and ask for a turn if
      -- another crawl took the slot (fair share)
      local w = redis.call('HMGET', KEYS[21], pkey, pkey .. SEP)  -- waiting crawl, last claimer
      local other
      if tat - tau > now then
        other = w[2] ~= KEYS[1]
      else
        other = own_slots(pkey) < inflight
      end
      if other and not w[1] then
        redis.call('HSET', KEYS[21], pkey, KEYS[1])
      end
      if tat - tau > now then
        redis.call('ZADD', KEYS[2], tat - tau, pkey)
      else
        park_at_cap(pkey, inflight, now)
      end
    else
      local w = redis.call('HMGET', KEYS[21], pkey, pkey .. SEP)  -- waiting crawl, last claimer
      local want = w[1]
      if want and want ~= KEYS[1] then
        -- another crawl waits on this pkey: leave it this slot, once
        redis.call('HDEL', KEYS[21], pkey)
        redis.call('ZADD', KEYS[2], tat + T - tau, pkey)
      else
        if want then redis.call('HDEL', KEYS[21], pkey) end
        local attempts, payload = pop(pkey, member)
        tat = tat + T
        redis.call('HSET', KEYS[3], pkey, tat)
        inflight = take_slot(pkey)
        renew_floor(pkey, now, floor)
        if w[2] ~= KEYS[1] then redis.call('HSET', KEYS[21], pkey .. SEP, KEYS[1]) end
        out[#out + 1] = new_claim('c', pkey, attempts, '', payload, now + vt)
        out[#out + 1] = attempts
        out[#out + 1] = ''
        out[#out + 1] = payload
        out[#out + 1] = T
        got = got + 1
        if not more then
          redis.call('ZREM', KEYS[2], pkey)
        elseif inflight < cap then
          redis.call('ZADD', KEYS[2], tat - tau, pkey)
        else
          park_at_cap(pkey, inflight, now)
        end
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
