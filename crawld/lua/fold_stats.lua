-- fold_stats: add a removed shard's counters to another shard's, once:
-- the mark field is set in the same step, so a rebalance re-run after a
-- crash does not add them twice (crawld/rebalance.py).
--
-- KEYS[1] the receiving shard's stats hash
-- ARGV[1] mark field (folded:<removed shard>:<rebalance generation>)
-- ARGV[2..] field, value pairs to add
-- Returns 1 if added, 0 if the mark was there.
if redis.call('HSETNX', KEYS[1], ARGV[1], 1) == 0 then return 0 end
for i = 2, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
