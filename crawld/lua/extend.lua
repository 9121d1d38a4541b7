-- extend: heartbeat; move the visibility deadline of claims still held.
-- Tokens no longer claimed are skipped (ZADD XX never re-creates a claim).
--
-- ARGV[4] vt   visibility timeout (microseconds)
-- ARGV[5..]    tokens
-- Returns the number of claims extended.
local now = now_us()
local deadline = now + tonumber(ARGV[4])
local n = 0
for i = 5, #ARGV do
  n = n + redis.call('ZADD', KEYS[5], 'XX', 'CH', deadline, ARGV[i])
end
return n
