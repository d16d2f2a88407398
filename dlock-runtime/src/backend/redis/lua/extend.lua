-- End a hold whose block of fencing tokens is used up while a waiter of the same runtime
-- wants the lock next: keep it (a new block, the lease renewed) when nobody outside the
-- holder's runtime waits, else release it as release.lua does for a flagged lock. One round
-- trip instead of a release and the next holder's attempt; waiters of other processes still
-- get their turn at the end of every block they flagged.
--
-- KEYS[1]  lock (see acquire.lua: the owner token, `+` appended when flagged)
-- KEYS[2]  fence counter
-- KEYS[3]  turns: the runtimes waiting for the key, in the order they came (acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  fence counter TTL in milliseconds (see acquire.lua)
-- ARGV[4]  the lowest fence a counter that was not recreated can hold (see acquire.lua)
-- ARGV[5]  fence block
-- ARGV[6]  release channel
-- ARGV[7]  this runtime's id (the message; the reservation's owner)
-- ARGV[8]  publish command: PUBLISH (one server) or SPUBLISH (Cluster)
-- ARGV[9]  reservation in milliseconds (see release.lua)
--
-- Returns fence > 0: kept, the LAST token of the new block (reserved by INCRBY while the
-- owner holds the key, so above every token given out before); -1: flagged, so released
-- (reserved for the next runtime in line, or for every other runtime, and published); 0: not
-- the owner.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return reserve_block(KEYS[2], ARGV[5], ARGV[4], ARGV[3])
end
if held == ARGV[1] .. '+' then
  -- Reserved for the first runtime in line, as release.lua does.
  redis.call('ZREM', KEYS[3], ARGV[7])
  local next = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if next then
    redis.call('ZREM', KEYS[3], next)
    redis.call('SET', KEYS[1], '>' .. next, 'PX', ARGV[9])
  else
    redis.call('SET', KEYS[1], '~' .. ARGV[7], 'PX', ARGV[9])
  end
  redis.call(ARGV[8], ARGV[6], ARGV[7])
  return -1
end
return 0
