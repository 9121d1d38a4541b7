-- nack: give a claim back after a failed attempt.  The entry is queued
-- again, or dead-lettered with the error once it has had max_attempts
-- claims.  The failure's host outcome (Retry-After, backoff, hold), when
-- given, is applied in the same step, before the entry is queued again:
-- no claim can take the entry back before its host is held.
--
-- ARGV[4] max_attempts
-- ARGV[5] token
-- ARGV[6] error         one-line reason
-- ARGV[7] count         "1": this attempt counts toward max_attempts;
--                       "0": it does not (e.g. deferred until robots.txt
--                       can be read)
-- ARGV[8] payload       "" to queue the entry as claimed, else the entry's
--                       new payload (a deferral count carried in it)
-- ARGV[9..16] optional host outcome: backoff_base_us, backoff_max_us,
--             max_failures, give_up_us, pkey, code, value, reason (as in
--             claim.lua)
-- Returns 1 requeued, 2 dead-lettered, 0 token not claimed.
local now = now_us()
local pkey, attempts, mode, payload = release(ARGV[5])
if ARGV[13] then
  host_outcome(ARGV[13], ARGV[14], tonumber(ARGV[15]), ARGV[16], now,
    {tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])})
end
if not pkey then return 0 end
if ARGV[8] and ARGV[8] ~= '' then payload = ARGV[8] end
redis.call('HINCRBY', KEYS[9], 'nacked', 1)
if ARGV[7] == '0' then
  attempts = attempts - 1
elseif attempts >= tonumber(ARGV[4]) then
  dead_letter(pkey, attempts, payload, ARGV[6], now, mode)
  if pkey ~= '' then schedule(pkey, now) end
  return 2
end
enqueue(pkey, attempts, mode, payload)
if pkey ~= '' then schedule(pkey, now) end
return 1
