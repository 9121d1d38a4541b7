-- ack: finish claims whose row is written and whose links are pushed.
-- A token no longer claimed (already acked, or reclaimed after its
-- visibility deadline) is ignored: a late ack never touches a newer claim.
--
-- ARGV[4..]  tokens, each optionally followed by SEP and the outcome of its
--            row (fetched, redirect, error, blocked, skipped): an acked
--            token counts its outcome in stats as "rows_<outcome>"
-- Returns the number of tokens acked.
local now = now_us()
local acked = 0
for i = 4, #ARGV do
  local token, outcome = ARGV[i], nil
  local cut = string.find(token, SEP, 1, true)
  if cut then
    outcome = string.sub(token, cut + 1)
    token = string.sub(token, 1, cut - 1)
  end
  local pkey = release(token)
  if pkey then
    if pkey ~= '' then schedule(pkey, now) end
    acked = acked + 1
    if outcome and outcome ~= '' then redis.call('HINCRBY', KEYS[9], 'rows_' .. outcome, 1) end
  end
end
if acked > 0 then redis.call('HINCRBY', KEYS[9], 'acked', acked) end
local late = #ARGV - 3 - acked
if late > 0 then redis.call('HINCRBY', KEYS[9], 'late_ack', late) end
return acked
