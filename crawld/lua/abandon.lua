-- abandon: drop every claim of the shard without queueing its entry again
-- (crawlctl purge of a crawl that still holds claims): each claim's
-- in-flight slot, shared with the other crawls of the domain, is given back
-- so that their cap is not lowered for good by a crawl that is gone.
--
-- ARGV[4] limit   most claims dropped in this call
-- Returns the number of claims dropped.
local tokens = redis.call('ZRANGE', KEYS[5], 0, tonumber(ARGV[4]) - 1)
local n = 0
for _, token in ipairs(tokens) do
  if release(token) then n = n + 1 end
end
return n
