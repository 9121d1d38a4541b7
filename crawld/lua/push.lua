-- push: add URLs to the frontier.  A URL to fetch (mode "") is queued if
-- its fingerprint was never queued before (dedup and enqueue in one atomic
-- step), unless its host is over its page budget or its host+path over its
-- query-variant limit: then it becomes a URL to record without fetching.
-- A URL pushed with a skip reason (mode ~= "") is queued on the skips list
-- once, and only if it was never queued for fetching.
--
-- ARGV[4] max_pages_per_host   (0 = no limit)
-- ARGV[5] max_query_variants   (0 = no limit)
-- ARGV[6..] groups of 6: fingerprint, pkey, host, variant key ("" when the
--           URL has no query), mode, payload (JSON)
-- Returns {queued, recorded, duplicates}.
local now = now_us()
local max_pages = tonumber(ARGV[4])
local max_variants = tonumber(ARGV[5])
local queued, skipped, dup = 0, 0, 0
for i = 6, #ARGV, 6 do
  local fp, pkey, host, vkey, mode, payload = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  if mode == '' then
    if redis.call('SADD', KEYS[7], fp) == 1 then
      if vkey ~= '' and max_variants > 0 and redis.call('HINCRBY', KEYS[17], vkey, 1) > max_variants then
        mode = 'too_many_query_variants'
      elseif max_pages > 0 and tonumber(redis.call('HGET', KEYS[16], host) or 0) >= max_pages then
        mode = 'over_budget'
      else
        if max_pages > 0 then redis.call('HINCRBY', KEYS[16], host, 1) end
        enqueue(pkey, 0, '', payload)
        schedule(pkey, now)
        queued = queued + 1
      end
      if mode ~= '' then
        redis.call('SADD', KEYS[12], fp)
        enqueue(pkey, 0, mode, payload)
        skipped = skipped + 1
      end
    else
      dup = dup + 1
    end
  elseif redis.call('SISMEMBER', KEYS[7], fp) == 0 and redis.call('SADD', KEYS[12], fp) == 1 then
    enqueue(pkey, 0, mode, payload)
    skipped = skipped + 1
  else
    dup = dup + 1
  end
end
if queued > 0 then redis.call('HINCRBY', KEYS[9], 'pushed', queued) end
if skipped > 0 then redis.call('HINCRBY', KEYS[9], 'skip_pushed', skipped) end
if dup > 0 then redis.call('HINCRBY', KEYS[9], 'dup', dup) end
return {queued, skipped, dup}
