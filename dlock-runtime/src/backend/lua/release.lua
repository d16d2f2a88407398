-- Release one hold of a lock, only for its owner; at hold count zero delete and notify.
--
-- KEYS[1]  lock hash
-- ARGV[1]  owner token
-- ARGV[2]  release channel `<prefix>{<key>}:released`
-- ARGV[3]  message: the releasing runtime's id (its own waiters were woken locally)
--
-- Returns 1 freed (deleted, published), 2 still held (hold count > 0), 0 not the owner.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
if redis.call('HINCRBY', KEYS[1], 'count', -1) > 0 then
  return 2
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
