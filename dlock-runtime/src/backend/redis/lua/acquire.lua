-- Acquire a lock, idempotent per owner token.
--
-- KEYS[1]  lock hash `<prefix>{<key>}`: fields owner, count (hold count), fence
-- KEYS[2]  fence counter `<prefix>{<key>}:fence`
-- ARGV[1]  owner token (random, 128-bit, hex)
-- ARGV[2]  lease in milliseconds (the hash's TTL)
-- ARGV[3]  fence counter TTL in milliseconds: the lease plus a margin
--
-- Returns one integer (cheaper than a table, on the hot path):
--         fence > 0     acquired fresh (the counter was bumped), or already held by this owner:
--                       a retry of the same request (TTL reset, same fence, still one hold;
--                       the runtime re-enters within a call chain locally, never here)
--         -1            held by another owner, with no TTL on the key
--         -2 - pttl     held by another owner whose lease has pttl ms left
--
-- Fencing: while the counter exists it only grows (INCR), whatever the server clock says. It
-- exists as long as any lock on the key does, and ARGV[3] minus the lease after: every
-- acquisition here and every renewal (renew.lua) pushes its expiry to ARGV[3] from now. Only
-- when it is missing (first use, that margin passed with the key unused, or the server lost its
-- data) does it start again, at the server clock in microseconds: above every token an earlier
-- counter of this key gave out (that one started at its own creation time in microseconds and
-- grew by one per acquisition, far slower than one per microsecond) unless the clock was
-- stepped back by more than the time since that earlier counter was created.
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == false then
  local fence = redis.call('INCR', KEYS[2])
  if fence == 1 then
    local now = redis.call('TIME')
    fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('SET', KEYS[2], string.format('%d', fence))
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1, 'fence', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return fence
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return tonumber(redis.call('HGET', KEYS[1], 'fence'))
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then
  return -1
end
return -2 - pttl
