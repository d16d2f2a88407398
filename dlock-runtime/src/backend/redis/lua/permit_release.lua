-- A permit's release (see permit_acquire.lua), only for its owner; publishes when somebody
-- outside this process waits for a permit.
--
-- KEYS[1]  permits `<prefix>{<key>}:permits`
-- KEYS[2]  size `<prefix>{<key>}:permits:n`
-- ARGV[1]  owner token
-- ARGV[2]  release channel
-- ARGV[3]  message: the releasing runtime's id
-- ARGV[4]  publish command: PUBLISH or SPUBLISH
--
-- Returns 1 released, 0 not a holder (expired, or never was).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local size = redis.call('GET', KEYS[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  local ttl = math.max(tonumber(last[2]) - now, 1)
  redis.call('PEXPIRE', KEYS[1], ttl)
  if size and string.sub(size, -1) == '+' then
    redis.call('SET', KEYS[2], string.sub(size, 1, -2), 'PX', ttl)
  end
else
  redis.call('DEL', KEYS[1], KEYS[2])
end
if size and string.sub(size, -1) == '+' then
  redis.call(ARGV[4], ARGV[2], ARGV[3])
end
return 1
