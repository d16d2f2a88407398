-- Delete a lock whoever holds it: the lock string (a writer, a reservation or the readers'
-- mark), the readers and a semaphore's permits with its size; and wake the waiters.
--
-- KEYS[1]  lock `<prefix>{<key>}`
-- KEYS[2]  readers `<prefix>{<key>}:readers`
-- KEYS[3]  permits `<prefix>{<key>}:permits`
-- KEYS[4]  the semaphore's size `<prefix>{<key>}:permits:n`
-- ARGV[1]  release channel
-- ARGV[2]  message
-- ARGV[3]  publish command: PUBLISH (one server) or SPUBLISH (Cluster)
--
-- Returns 1 when something was deleted, 0 when the key was free.
if redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4]) > 0 then
  redis.call(ARGV[3], ARGV[1], ARGV[2])
  return 1
end
return 0
