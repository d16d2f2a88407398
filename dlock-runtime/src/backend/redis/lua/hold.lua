-- End a hold whose key must stay taken a while longer (hold_at_least), only for its owner: the
-- key is kept, with the remaining time as its TTL, and frees by itself when that runs out.
--
-- KEYS[1]  lock (see acquire.lua: the owner token, `+` appended when flagged)
-- ARGV[1]  owner token
-- ARGV[2]  remaining hold in milliseconds (the key's new TTL)
-- ARGV[3]  release channel `<prefix>{<key>}:released`
-- ARGV[4]  message: the holding runtime's id (its own waiters were woken locally)
-- ARGV[5]  publish command: PUBLISH (one server) or SPUBLISH (Cluster: sharded, same slot)
--
-- A flagged lock (somebody outside this process waits) is published: its waiters were told the
-- lease's TTL and look again, finding the key taken with the hold's TTL (not free: nobody
-- gets the key before the hold ends).
--
-- Returns 1 kept, 0 not the owner.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if held == ARGV[1] .. '+' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call(ARGV[5], ARGV[3], ARGV[4])
  return 1
end
return 0
