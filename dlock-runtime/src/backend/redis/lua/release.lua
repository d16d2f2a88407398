-- Release a lock, only for its owner; notify only when somebody outside this process waits.
--
-- KEYS[1]  lock (see acquire.lua: the owner token, `+` appended when flagged)
-- ARGV[1]  owner token
-- ARGV[2]  release channel `<prefix>{<key>}:released`
-- ARGV[3]  message: the releasing runtime's id (its own waiters were woken locally)
-- ARGV[4]  publish command: PUBLISH (one server) or SPUBLISH (Cluster: sharded, same slot)
-- ARGV[5]  reservation in milliseconds (see below)
--
-- A flagged lock is not deleted but reserved for ARGV[5] ms for the waiters of every other
-- runtime (`~<runtime id>`, acquire.lua), then published: the releasing runtime's own waiters,
-- woken at once and without a round trip, would otherwise win every race against waiters
-- that learn of the release by message, and one process could keep a busy key to itself.
--
-- Returns 1 freed (deleted, or reserved and published when flagged), 0 not the owner.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if held == ARGV[1] .. '+' then
  redis.call('SET', KEYS[1], '~' .. ARGV[3], 'PX', ARGV[5])
  redis.call(ARGV[4], ARGV[2], ARGV[3])
  return 1
end
return 0
