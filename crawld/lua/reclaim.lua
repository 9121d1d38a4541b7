-- reclaim: return claims past their visibility deadline to the queue, or to
-- the dead-letter list once they have had max_attempts claims (a URL that
-- keeps killing its worker must not kill workers forever).
--
-- ARGV[4] max_attempts
-- ARGV[5] limit         most claims handled in this call
-- Returns {requeued, dead_lettered}.
local now = now_us()
local max_attempts = tonumber(ARGV[4])
local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))
local requeued, dead = 0, 0
for _, token in ipairs(expired) do
  local pkey, attempts, mode, payload = release(token)
  if pkey then
    if attempts >= max_attempts then
      dead_letter(pkey, attempts, payload, 'visibility timeout expired on attempt ' .. attempts, now, mode)
      dead = dead + 1
    else
      enqueue(pkey, attempts, mode, payload)
      requeued = requeued + 1
    end
    if pkey ~= '' then schedule(pkey, now) end
  end
end
if requeued > 0 then redis.call('HINCRBY', KEYS[9], 'reclaimed', requeued) end
return {requeued, dead}
