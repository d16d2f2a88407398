-- Release a lock, only for its owner; notify only when somebody outside this process waits.
--
-- KEYS[1]  lock (see acquire.lua: the owner token, `+` appended when flagged)
-- KEYS[2]  turns: the runtimes waiting for the key, in the order they came (acquire.lua)
-- ARGV[1]  owner token (its first 16 characters are the releasing runtime's id)
-- ARGV[2]  publish command: PUBLISH (one server) or SPUBLISH (Cluster: sharded, same slot)
-- ARGV[3]  reservation in milliseconds (see below)
--
-- A flagged lock is not deleted but reserved for ARGV[3] ms: for the first runtime in line
-- other than the releaser (`><runtime id>`, acquire.lua), which leaves the line, or when
-- nobody is in line, for the waiters of every other runtime (`~<runtime id>`); then published
-- on the release channel
-- `KEYS[1]:released` with the releasing runtime's id as message: the releasing runtime's own
-- waiters, woken at once and without a round trip, would otherwise win every race against
-- waiters that learn of the release by message, and one process could keep a busy key to
-- itself; and the runtimes told of a release would race for it, the one the server tells
-- first winning most turns. The message still goes to every runtime: should the one whose
-- turn it is be gone, the others find the key free once the reservation lapses. (The channel and the id are derived here rather than sent: the release runs after
-- every hold, and the arguments it does not need are work for both sides.)
--
-- Returns 1 freed (deleted, or reserved and published when flagged), 0 not the owner.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if held == ARGV[1] .. '+' then
  local origin = string.sub(ARGV[1], 1, 16)
  redis.call('ZREM', KEYS[2], origin)
  local next = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if next then
    redis.call('ZREM', KEYS[2], next)
    redis.call('SET', KEYS[1], '>' .. next, 'PX', ARGV[3])
  else
    redis.call('SET', KEYS[1], '~' .. origin, 'PX', ARGV[3])
  end
  redis.call(ARGV[2], KEYS[1] .. ':released', origin)
  return 1
end
return 0
