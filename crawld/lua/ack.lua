-- ack: finish claims whose row is written and whose links are pushed.
-- A token no longer claimed (already acked, or reclaimed after its
-- visibility deadline) is ignored: a late ack never touches a newer claim.
--
-- ARGV[4..]  tokens
-- Returns the number of tokens acked.
local now = now_us()
local acked = 0
for i = 4, #ARGV do
  local pkey = release(ARGV[i])
  if pkey then
    if pkey ~= '' then schedule(pkey, now) end
    acked = acked + 1
  end
end
if acked > 0 then redis.call('HINCRBY', KEYS[9], 'acked', acked) end
local late = #ARGV - 3 - acked
if late > 0 then redis.call('HINCRBY', KEYS[9], 'late_ack', late) end
return acked
