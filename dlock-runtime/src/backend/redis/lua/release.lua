-- Release a lock, only for its owner; notify only when somebody outside this process waits.
--
-- KEYS[1]  lock (see acquire.lua: the owner token, `+` appended when flagged)
-- ARGV[1]  owner token
-- ARGV[2]  release channel `<prefix>{<key>}:released`
-- ARGV[3]  message: the releasing runtime's id (its own waiters were woken locally)
-- ARGV[4]  publish command: PUBLISH (one server) or SPUBLISH (Cluster: sharded, same slot)
--
-- Returns 1 freed (deleted; published if flagged), 0 not the owner.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if held == ARGV[1] .. '+' then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[4], ARGV[2], ARGV[3])
  return 1
end
return 0
