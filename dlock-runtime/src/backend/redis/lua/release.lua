-- Release one hold of a lock, only for its owner; at hold count zero delete and notify.
--
-- KEYS[1]  lock hash
-- ARGV[1]  owner token
-- ARGV[2]  release channel `<prefix>{<key>}:released`
-- ARGV[3]  message: the releasing runtime's id (its own waiters were woken locally)
-- ARGV[4]  publish command: PUBLISH (one server) or SPUBLISH (Cluster: sharded, same slot)
--
-- Returns 1 freed (deleted, published), 2 still held (hold count > 0), 0 not the owner.
local held = redis.call('HMGET', KEYS[1], 'owner', 'count')
if held[1] ~= ARGV[1] then
  return 0
end
if tonumber(held[2]) > 1 then
  redis.call('HINCRBY', KEYS[1], 'count', -1)
  return 2
end
redis.call('DEL', KEYS[1])
redis.call(ARGV[4], ARGV[2], ARGV[3])
return 1
