-- requeue: queue URLs to be fetched again although their fingerprint is in
-- the visited set (crawlctl retry: URLs whose row is an error).  Each is
-- queued at the back of its politeness key's queue, with no attempt spent,
-- and its key put on the schedule; the page budget is not charged again.
--
-- ARGV[4..] pairs: pkey, payload (JSON; it carries the retry generation)
-- Returns the number of URLs queued (added to stats "retried").
local now = now_us()
local n = 0
for i = 4, #ARGV, 2 do
  enqueue(ARGV[i], 0, '', ARGV[i + 1])
  schedule(ARGV[i], now)
  n = n + 1
end
if n > 0 then redis.call('HINCRBY', KEYS[9], 'retried', n) end
return n
