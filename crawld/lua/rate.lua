-- rate: slow a politeness key down (robots.txt Crawl-delay); never speeds
-- it up: the interval kept is the largest asked for, and never below T0.
--
-- ARGV[4] pkey
-- ARGV[5] emission interval (microseconds)
-- Returns the interval in force.
local pkey = ARGV[4]
local T = tonumber(ARGV[5])
local cur = tonumber(redis.call('HGET', KEYS[13], pkey) or T0)
if T > cur then
  redis.call('HSET', KEYS[13], pkey, T)
  cur = T
end
return math.floor(cur)
