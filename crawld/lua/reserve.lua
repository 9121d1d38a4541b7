-- reserve: book one more request to a politeness key than its claims
-- account for: a robots.txt fetch takes the slot of the claim that needed
-- it, so the page itself needs another, and each redirect hop of a
-- robots.txt fetch needs its own.  Charges GCRA as a claim does (the
-- interval in force, shared by every crawl) and says how long to wait
-- before the booked request conforms.
--
-- ARGV[4] pkey
-- Returns the wait in microseconds (0: go now).
local now = now_us()
local pkey = ARGV[4]
local T, tau, floor = interval(pkey, now)
local tat = tonumber(redis.call('HGET', KEYS[3], pkey) or 0)
local wait = tat - tau - now
if wait < 0 then wait = 0 end
if tat < now then tat = now end
tat = tat + T
redis.call('HSET', KEYS[3], pkey, tat)
renew_floor(pkey, now, floor)
if redis.call('ZSCORE', KEYS[2], pkey) then
  redis.call('ZADD', KEYS[2], 'GT', tat - tau, pkey)
end
return math.floor(wait)
