-- counts: one shard's counts, read atomically (read-only).  Used by
-- Frontier.snapshot (crawlctl queue-depth, the run's end-of-crawl check) and
-- crawld.status (crawlctl status, /metrics) instead of MULTI/EXEC, so that
-- the same code runs on a single Redis and on Redis Cluster: one script on
-- one slot, with TIME read on the node that holds the shard.
-- Loaded on its own (without _lib.lua); it takes no ARGV.
--
-- KEYS: the shard keys in crawld.keys.SHARD_KEY_NAMES order (as every script)
-- Returns {sec, usec, queued, scheduled, claimed, oldest claim deadline
--          (score as a string, "" when nothing is claimed), claims expired
--          (deadline <= now), skips, dead, stats (flat field/value list),
--          lease token or nil}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
local oldest, expired = '', 0
if #first > 0 then
  oldest = first[2]
  if tonumber(oldest) <= now then expired = redis.call('ZCOUNT', KEYS[5], '-inf', now) end
end
return {t[1], t[2], redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[5]),
        oldest, expired, redis.call('LLEN', KEYS[11]), redis.call('LLEN', KEYS[8]),
        redis.call('HGETALL', KEYS[9]), redis.call('GET', KEYS[19])}
