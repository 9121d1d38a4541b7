-- push: add entries to the frontier if never seen before (dedup and enqueue
-- in one atomic step).
--
-- ARGV[1] tau      GCRA burst tolerance (microseconds)
-- ARGV[2] cap      per-pkey in-flight cap
-- ARGV[3..]        triples: fingerprint, pkey, payload (JSON)
-- Returns the number of entries added (the others were duplicates).
local now = now_us()
local tau = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local added = 0
for i = 3, #ARGV, 3 do
  if redis.call('SADD', KEYS[7], ARGV[i]) == 1 then
    local pkey = ARGV[i + 1]
    enqueue(pkey, 0, ARGV[i + 2])
    schedule(pkey, now, tau, cap)
    added = added + 1
  end
end
local n = (#ARGV - 2) / 3
if added > 0 then redis.call('HINCRBY', KEYS[9], 'pushed', added) end
if n > added then redis.call('HINCRBY', KEYS[9], 'dup', n - added) end
return added
