-- rebalance_start: create a rebalance's progress hash in one step, unless
-- one exists (crawld/rebalance.py).
--
-- KEYS[1] the progress hash (crawld.keys.crawl_rebalance)
-- ARGV    field, value pairs (to, from, token, prev_state, epoch, phase)
-- Returns 1 if created, 0 if a progress hash was there.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
