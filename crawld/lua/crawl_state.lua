-- crawl_state: set a crawl's operator state (crawlctl pause|resume|cancel,
-- crawlctl rebalance).  Cancelled is final: a cancelled crawl keeps it.
-- While the crawl is rebalancing and its rebalance progress hash exists,
-- the state asked for is recorded as the progress' prev_state, which the
-- rebalancer gives the crawl when it ends (crawld/rebalance.py).
--
-- KEYS[1] crawl state (crawld.keys.crawl_state)
-- KEYS[2] optional: the crawl's rebalance progress (crawld.keys.crawl_rebalance);
--         without it the state is always set
-- ARGV[1] the state: active, paused, cancelled or rebalancing
-- Returns the state before (active when the key was absent).
local cur = redis.call('GET', KEYS[1])
if cur == 'cancelled' then return cur end
if KEYS[2] and cur == 'rebalancing' and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'prev_state', ARGV[1])
  return cur
end
redis.call('SET', KEYS[1], ARGV[1])
return cur or 'active'
