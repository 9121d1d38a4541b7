-- ack: finish claims whose row is written and whose links are pushed.
-- A token no longer claimed (already acked, or reclaimed after its
-- visibility deadline) is ignored: a late ack never touches a newer claim.
--
-- ARGV[1] tau   GCRA tolerance (microseconds)
-- ARGV[2] cap   per-pkey in-flight cap
-- ARGV[3..]     tokens
-- Returns the number of tokens acked.
local now = now_us()
local tau = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local acked = 0
for i = 3, #ARGV do
  local pkey = release(ARGV[i])
  if pkey then
    schedule(pkey, now, tau, cap)
    acked = acked + 1
  end
end
if acked > 0 then redis.call('HINCRBY', KEYS[9], 'acked', acked) end
local late = #ARGV - 2 - acked
if late > 0 then redis.call('HINCRBY', KEYS[9], 'late_ack', late) end
return acked
