-- One permit of a semaphore: at most N holders, each an owner token in a sorted set scored by
-- its expiry in server time (ms); the semaphore's size N is kept beside it while it has
-- holders (`+` appended once somebody outside waits: the next release publishes).
--
-- KEYS[1]  permits `<prefix>{<key>}:permits`
-- KEYS[2]  size `<prefix>{<key>}:permits:n`
-- KEYS[3]  fence counter `<prefix>{<key>}:fence`
-- ARGV[1]  owner token (ends in `-s<N>`)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  fence counter TTL in milliseconds (lease plus a margin)
-- ARGV[4]  the lowest fence a counter that was not recreated can hold (see acquire.lua)
-- ARGV[5]  N, the number of permits asked
-- ARGV[6]  1: a waiter's attempt (flags the semaphore so that the next release notifies)
--
-- Returns {1, fence} acquired; {0, ms} every permit taken, the first frees within ms;
-- {2, n} the semaphore has holders that asked for n permits, not N.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local count = redis.call('ZCARD', KEYS[1])
local size = redis.call('GET', KEYS[2])
local asked = tonumber(ARGV[5])
if count == 0 then size = false end
local flag = ''
if size then
  if string.sub(size, -1) == '+' then flag = '+'; size = string.sub(size, 1, -2) end
  if tonumber(size) ~= asked then return {2, tonumber(size)} end
end
local mine = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not mine and count >= asked then
  if ARGV[6] == '1' and flag == '' then
    redis.call('SET', KEYS[2], size .. '+', 'KEEPTTL')
  end
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, math.max(tonumber(first[2]) - now, 1)}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local ttl = math.max(tonumber(last[2]) - now, 1)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('SET', KEYS[2], ARGV[5] .. flag, 'PX', ttl)
local fence = redis.call('INCR', KEYS[3])
if fence < tonumber(ARGV[4]) then
  fence = math.max(fence, tonumber(t[1]) * 1000000 + tonumber(t[2]) + 1)
  redis.call('SET', KEYS[3], string.format('%d', fence), 'PX', ARGV[3])
else
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
return {1, fence}
