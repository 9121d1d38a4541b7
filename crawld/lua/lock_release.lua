-- lock_release: delete a lock held by ARGV[1].
-- KEYS[1] the lock.  Returns 1 if it was held and is deleted, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
