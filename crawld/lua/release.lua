-- release: give a shard's lease up (at a clean stop), if the caller holds it,
-- so that a standby need not wait for it to expire.
--
-- ARGV[4] token
-- Returns 1 if released, 0 if the caller did not hold it.
if redis.call('GET', KEYS[19]) == ARGV[4] then
  redis.call('DEL', KEYS[19])
  return 1
end
return 0
