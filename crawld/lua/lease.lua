-- lease: take or renew the lease of a shard (one server per shard at a time).
-- A lease is the shard's lease key holding the server's token with a time
-- to live; only the holder can renew it; when the holder stops renewing
-- (its machine died) the key expires and a standby takes it.
--
-- ARGV[4] token   the caller's lease token
-- ARGV[5] ttl_ms  time to live
-- ARGV[6] epoch   (optional) the crawl's rebalance generation the caller's
--                 config comes from; when the shard was moved by a later
--                 rebalance (stats field rebalance_epoch), nothing is taken
--                 and -1 returned: the caller must reload the crawl first
-- Returns 1 if the caller holds the lease now, 0 if another token does.
if ARGV[6] and ARGV[6] ~= '' and
    tonumber(redis.call('HGET', KEYS[9], 'rebalance_epoch') or '0') > tonumber(ARGV[6]) then
  return -1
end
local cur = redis.call('GET', KEYS[19])
if cur == ARGV[4] then
  redis.call('PEXPIRE', KEYS[19], ARGV[5])
  return 1
end
if not cur then
  redis.call('SET', KEYS[19], ARGV[4], 'PX', ARGV[5])
  return 1
end
return 0
