-- Test driver (tests/test_politeness_math.py): runs one function of the
-- frontier prelude (crawld/lua/_lib.lua, prepended) at a given time, so the
-- Lua rate arithmetic can be checked against crawld/politeness.py on one
-- table.  KEYS and ARGV[1..3] as for every frontier script.
--
-- ARGV[4] op: "interval" | "slowdown" | "success" | "floor"
-- ARGV[5] pkey
-- ARGV[6] now (us)
-- ARGV[7] max_interval (us, slowdown)    ARGV[8] "1" if told (slowdown)
-- Returns {interval in force, adapt value or false, floor value or false}.
local op, pkey, now = ARGV[4], ARGV[5], tonumber(ARGV[6])
if op == 'slowdown' then
  slow_down(pkey, now, tonumber(ARGV[7]), ARGV[8] == '1')
elseif op == 'success' then
  speed_up(pkey)
elseif op == 'floor' then
  local _, _, f = interval(pkey, now)
  renew_floor(pkey, now, f)
end
return {interval(pkey, now), redis.call('HGET', KEYS[20], pkey), redis.call('HGET', KEYS[22], pkey)}
