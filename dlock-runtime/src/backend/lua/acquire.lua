-- Acquire (or re-enter) a reentrant lock, Redisson style.
--
-- KEYS[1]  lock hash `<prefix>{<key>}`: fields owner, count (hold count), fence
-- KEYS[2]  fence counter `<prefix>{<key>}:fence`
-- ARGV[1]  owner token (random, 128-bit, hex)
-- ARGV[2]  lease in milliseconds (the hash's TTL)
-- ARGV[3]  fence counter TTL in milliseconds
--
-- Returns {1, fence}  acquired fresh: the counter was bumped, floored at the server clock in
--                     microseconds so that it never goes back after a restart with no data
--         {2, fence}  re-entered by the same owner: hold count + 1, TTL reset, same fence
--         {0, pttl}   held by another owner; pttl is its remaining lease in ms (-1: no TTL)
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == false then
  local fence = redis.call('INCR', KEYS[2])
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if fence < floor then
    redis.call('INCRBY', KEYS[2], floor - fence)
    fence = floor
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1, 'fence', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence}
end
if owner == ARGV[1] then
  redis.call('HINCRBY', KEYS[1], 'count', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {2, tonumber(redis.call('HGET', KEYS[1], 'fence'))}
end
return {0, redis.call('PTTL', KEYS[1])}
