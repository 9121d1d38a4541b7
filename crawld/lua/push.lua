-- push: add URLs to the frontier.  A URL to fetch (mode "") is queued if
-- its fingerprint was never queued before (dedup and enqueue in one atomic
-- step), unless its host is over its page budget or its host+path over its
-- query-variant limit: then it becomes a URL to record without fetching.
-- A URL pushed with a skip reason (mode ~= "") is queued on the skips list
-- once, and only if it was never queued for fetching.
--
-- ARGV[4] max_pages_per_host   (0 = no limit)
-- ARGV[5] max_query_variants   (0 = no limit)
-- ARGV[6] dedup spec (crawld.dedup.push_spec): "set <bits>" or
--         "bloom <m> <k> <capacity> <p>"; used only by the first push that
--         creates a dedup structure of the shard, later pushes read the
--         layout recorded in it
-- ARGV[7..] groups of 6: tagged fingerprint (the URL's 8-byte fingerprint
--           then its politeness key's 2-byte slot, big-endian:
--           crawld.sharding.key_slot), pkey, host, variant key ("" when
--           the URL has no query), mode, payload (JSON)
-- Returns {queued, recorded, duplicates}.
--
-- Dedup structures (crawld/dedup.py): KEYS[7] (seen) and KEYS[12]
-- (skipseen) are each a hash recording the structure's layout (b = set,
-- lua or bf; bits; m, k, cap, p; n = fingerprints added); the data lives
-- in keys built here from those names: "<key>:<bucket>" (redis_set, intset
-- buckets), "<key>:bits" (Bloom filter bitmap) or "<key>:bf" (RedisBloom).
-- They are NOT declared in KEYS, but they extend a declared key's name
-- after its hash tag "{crawl_id:shard}", so they hash to the same Redis
-- Cluster slot as every declared key.  A seen/skipseen that is a plain set
-- (a crawl created before the dedup backends) is used as such.
local function dd_open(key)
  local meta = redis.pcall('HMGET', key, 'b', 'bits', 'm', 'k')
  if meta.err then
    return {b = 'plain', key = key, added = 0}
  end
  if not meta[1] then
    -- first use on this shard: lay the structure out from the spec
    local w = {}
    for x in string.gmatch(ARGV[6], '%S+') do w[#w + 1] = x end
    if w[1] == 'set' then
      redis.call('HSET', key, 'b', 'set', 'bits', w[2], 'n', 0)
      meta = {'set', w[2]}
    else
      local m, k, cap, p = w[2], w[3], w[4], w[5]
      local probe = redis.pcall('BF.EXISTS', key .. ':bf', '')
      if type(probe) == 'table' and probe.err then
        -- no RedisBloom: a bitmap of m bits, allocated at once and exactly
        -- (SETRANGE on a missing key makes a string of that very length)
        redis.call('SETRANGE', key .. ':bits', math.ceil(tonumber(m) / 8) - 1, '\0')
        meta = {'lua', false, m, k}
      else
        redis.call('BF.RESERVE', key .. ':bf', p, cap)
        meta = {'bf', false, m, k}
      end
      redis.call('HSET', key, 'b', meta[1], 'm', m, 'k', k, 'cap', cap, 'p', p, 'n', 0)
    end
  end
  return {b = meta[1], key = key, bits = tonumber(meta[2]), m = tonumber(meta[3]), k = tonumber(meta[4]),
    added = 0}
end

-- high and low 32 bits of a 64-bit fingerprint (exact in Lua's doubles)
local function fp_words(fp)
  if #fp < 8 then fp = fp .. string.rep('\0', 8 - #fp) end
  local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(fp, 1, 8)
  return ((b1 * 256 + b2) * 256 + b3) * 256 + b4, ((b5 * 256 + b6) * 256 + b7) * 256 + b8
end

-- redis_set: bucket = top `bits` bits of the fingerprint, member = slot *
-- 2^32 + its low 32 bits (a 48-bit integer: the bucket's intset keeps
-- 8-byte entries, and each entry says which shard its domain belongs to)
local function dd_bucket(d, fp)
  local hi, lo = fp_words(fp)
  local bucket = d.key .. ':' .. string.format('%d', math.floor(hi / 2 ^ (32 - d.bits)))
  local s1, s2 = string.byte(fp, 9, 10)
  return bucket, string.format('%d', ((s1 or 0) * 256 + (s2 or 0)) * 4294967296 + lo)
end

-- Bloom filter over a bitmap: the BITFIELD arguments that set the k bits
-- (h1 + i h2) mod m, i = 0..k-1, of fp: double hashing with h1, h2 its high
-- and low 32 bits (Kirsch & Mitzenmacher, ESA 2006); one call per URL (k
-- SETBIT calls cost ~20% more)
local function dd_bits(d, fp)
  local h1, h2 = fp_words(fp)
  local a = {}
  for i = 0, d.k - 1 do
    a[#a + 1] = 'SET'; a[#a + 1] = 'u1'; a[#a + 1] = string.format('%d', math.fmod(h1 + i * h2, d.m)); a[#a + 1] = '1'
  end
  return a
end

-- 1 if fp was not in d (it is now), else 0
local function dd_add(d, fp)
  local new
  if d.b == 'set' then
    local key, member = dd_bucket(d, fp)
    new = redis.call('SADD', key, member)
  elseif d.b == 'lua' then
    new = 0
    for _, old in ipairs(redis.call('BITFIELD', d.key .. ':bits', unpack(dd_bits(d, fp)))) do
      if old == 0 then new = 1 end
    end
  elseif d.b == 'bf' then
    new = redis.call('BF.ADD', d.key .. ':bf', string.sub(fp, 1, 8))
  else
    return redis.call('SADD', d.key, string.sub(fp, 1, 8))
  end
  d.added = d.added + new
  return new
end

-- whether fp is in d
local function dd_has(d, fp)
  if d.b == 'set' then
    local key, member = dd_bucket(d, fp)
    return redis.call('SISMEMBER', key, member) == 1
  elseif d.b == 'lua' then
    -- GETBIT one by one: a URL not in the filter stops at its first 0 bit
    local h1, h2 = fp_words(fp)
    local bm = d.key .. ':bits'
    for i = 0, d.k - 1 do
      if redis.call('GETBIT', bm, string.format('%d', math.fmod(h1 + i * h2, d.m))) == 0 then return false end
    end
    return true
  elseif d.b == 'bf' then
    return redis.call('BF.EXISTS', d.key .. ':bf', string.sub(fp, 1, 8)) == 1
  end
  return redis.call('SISMEMBER', d.key, string.sub(fp, 1, 8)) == 1
end

local dd_seen, dd_skipseen
local function seen()
  if not dd_seen then dd_seen = dd_open(KEYS[7]) end
  return dd_seen
end
local function skipseen()
  if not dd_skipseen then dd_skipseen = dd_open(KEYS[12]) end
  return dd_skipseen
end

local now = now_us()
local max_pages = tonumber(ARGV[4])
local max_variants = tonumber(ARGV[5])
local queued, skipped, dup = 0, 0, 0
for i = 7, #ARGV, 6 do
  local fp, pkey, host, vkey, mode, payload = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  if mode == '' then
    if dd_add(seen(), fp) == 1 then
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
        dd_add(skipseen(), fp)
        enqueue(pkey, 0, mode, payload)
        skipped = skipped + 1
      end
    else
      dup = dup + 1
    end
  elseif not dd_has(seen(), fp) and dd_add(skipseen(), fp) == 1 then
    enqueue(pkey, 0, mode, payload)
    skipped = skipped + 1
  else
    dup = dup + 1
  end
end
if queued > 0 then redis.call('HINCRBY', KEYS[9], 'pushed', queued) end
if skipped > 0 then redis.call('HINCRBY', KEYS[9], 'skip_pushed', skipped) end
if dup > 0 then redis.call('HINCRBY', KEYS[9], 'dup', dup) end
for _, d in ipairs({dd_seen or {}, dd_skipseen or {}}) do
  if d.added and d.added > 0 and d.b ~= 'plain' then redis.call('HINCRBY', d.key, 'n', d.added) end
end
return {queued, skipped, dup}
