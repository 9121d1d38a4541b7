-- lock_renew: extend a lock held by ARGV[1] to ARGV[2] milliseconds.
-- KEYS[1] the lock.  Returns 1 if held (and extended), else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
