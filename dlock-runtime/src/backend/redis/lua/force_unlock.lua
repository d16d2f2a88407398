-- Delete a lock whoever holds it, and wake its waiters.
--
-- KEYS[1]  lock hash
-- ARGV[1]  release channel
-- ARGV[2]  message
-- ARGV[3]  publish command: PUBLISH (one server) or SPUBLISH (Cluster)
--
-- Returns 1 when a lock was deleted, 0 when the key was free.
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call(ARGV[3], ARGV[1], ARGV[2])
  return 1
end
return 0
