-- rate: slow a politeness key down (robots.txt Crawl-delay); never speeds
-- it up: the interval kept is the largest asked for, and never below T0.
-- The request last charged at the old interval (typically the robots.txt
-- fetch that revealed the delay) is re-charged at the new one, so the next
-- request also keeps the new distance from it.
--
-- ARGV[4] pkey
-- ARGV[5] emission interval (microseconds)
-- Returns the interval in force.
local pkey = ARGV[4]
local T = tonumber(ARGV[5])
local cur = tonumber(redis.call('HGET', KEYS[13], pkey) or T0)
if T > cur then
  redis.call('HSET', KEYS[13], pkey, T)
  local tat = tonumber(redis.call('HGET', KEYS[3], pkey) or 0)
  local now = now_us()
  if tat + T - cur > now then
    tat = tat + T - cur
    redis.call('HSET', KEYS[3], pkey, tat)
    if redis.call('ZSCORE', KEYS[2], pkey) then
      redis.call('ZADD', KEYS[2], 'GT', tat - BM1 * T, pkey)
    end
  end
  cur = T
end
return math.floor(cur)
