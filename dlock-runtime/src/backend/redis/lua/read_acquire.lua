-- A reader's attempt on a read-write lock.
--
-- The readers of a key are a sorted set of owner tokens scored by their expiry in server time
-- (ms); while any reader holds, the lock string itself holds the readers' mark
-- `=<writer-waiting-until ms>` (a `+` appended when somebody outside waits), with the TTL of
-- the latest reader, so that an exclusive (write) attempt finds the key taken as it finds a
-- writer. A writer that finds readers sets the writer-waiting time in the mark (acquire.lua);
-- until then new readers queue behind it (writer preference).
--
-- KEYS[1]  lock `<prefix>{<key>}` (see acquire.lua)
-- KEYS[2]  fence counter `<prefix>{<key>}:fence`
-- KEYS[3]  readers `<prefix>{<key>}:readers`
-- ARGV[1]  owner token (ends in `-r`)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  fence counter TTL in milliseconds (lease plus a margin)
-- ARGV[4]  the lowest fence a counter that was not recreated can hold (see acquire.lua)
-- ARGV[5]  this runtime's id
-- ARGV[6]  1: a waiter's attempt (flags a writer's lock so that its release notifies)
--
-- Returns one integer: fence > 0 acquired (this reader's token); -1 busy without a TTL;
-- -2 - ms busy, look again within ms.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, 1) == '~' then
  -- Reserved after a flagged release: for every runtime but the one that released.
  local by = string.sub(held, 2)
  if string.sub(by, -1) == '+' then by = string.sub(by, 1, -2) end
  if by ~= ARGV[5] then held = false end
end
local mine = redis.call('ZSCORE', KEYS[3], ARGV[1])
local mark = '=0'
if held and string.sub(held, 1, 1) ~= '=' then
  -- A writer holds (or the key is reserved for other runtimes): flag it so that its release
  -- notifies, unless the holder is of this runtime (its release wakes us locally).
  if ARGV[6] == '1' and string.sub(held, -1) ~= '+' and string.sub(held, 1, #ARGV[5]) ~= ARGV[5] then
    redis.call('SET', KEYS[1], held .. '+', 'KEEPTTL')
  end
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then return -1 end
  return -2 - pttl
elseif held then
  mark = held
  local body = string.sub(held, 2)
  if string.sub(body, -1) == '+' then body = string.sub(body, 1, -2) end
  local writer_until = tonumber(body) or 0
  if writer_until > now and not mine then
    return -2 - (writer_until - now)
  end
end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
local ttl = math.max(tonumber(last[2]) - now, 1)
redis.call('SET', KEYS[1], mark, 'PX', ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
local fence = redis.call('INCR', KEYS[2])
if fence < tonumber(ARGV[4]) then
  fence = math.max(fence, tonumber(t[1]) * 1000000 + tonumber(t[2]) + 1)
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[3])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return fence
