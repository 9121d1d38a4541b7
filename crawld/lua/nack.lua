-- nack: give a claim back after a failed attempt.  The entry is queued again
-- (and its pkey's next fetch pushed back by delay), or dead-lettered with
-- the error once it has had max_attempts claims.
--
-- ARGV[1] tau           GCRA tolerance (microseconds)
-- ARGV[2] cap           per-pkey in-flight cap
-- ARGV[3] max_attempts
-- ARGV[4] token
-- ARGV[5] delay         microseconds before the pkey may be fetched again
-- ARGV[6] error         one-line reason
-- Returns 1 requeued, 2 dead-lettered, 0 token not claimed.
local now = now_us()
local tau = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local pkey, attempts, payload = release(ARGV[4])
if not pkey then return 0 end
redis.call('HINCRBY', KEYS[9], 'nacked', 1)
if attempts >= tonumber(ARGV[3]) then
  dead_letter(pkey, attempts, payload, ARGV[6], now)
  schedule(pkey, now, tau, cap)
  return 2
end
local delay = tonumber(ARGV[5])
if delay > 0 then
  local tat = tonumber(redis.call('HGET', KEYS[3], pkey) or 0)
  if tat < now + delay + tau then
    redis.call('HSET', KEYS[3], pkey, now + delay + tau)
  end
  -- a pkey already on the schedule moves back too
  if redis.call('ZSCORE', KEYS[2], pkey) then
    redis.call('ZADD', KEYS[2], 'GT', now + delay, pkey)
  end
end
enqueue(pkey, attempts, payload)
schedule(pkey, now, tau, cap)
return 1
