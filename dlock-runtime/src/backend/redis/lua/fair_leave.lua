-- A waiter of a fair lock gives up (its wait ran out): it leaves the line, and when it was
-- first in line while the lock is free, the waiters behind it are told to look again.
--
-- KEYS[1]  lock `<prefix>{<key>}`
-- KEYS[2]  queue `<prefix>{<key>}:queue` (see fair_acquire.lua)
-- KEYS[3]  places `<prefix>{<key>}:places`
-- ARGV[1]  owner token
-- ARGV[2]  release channel `<prefix>{<key>}:released`
-- ARGV[3]  message (never a runtime id: every runtime's waiters look again)
-- ARGV[4]  publish command: PUBLISH (one server) or SPUBLISH (Cluster)
--
-- Returns 1 when the waiter was in line, 0 otherwise.
local first = redis.call('LINDEX', KEYS[2], 0)
local removed = redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if first == ARGV[1] and redis.call('LLEN', KEYS[2]) > 0 then
  local held = redis.call('GET', KEYS[1])
  -- Free for a fair lock (see fair_acquire.lua): nothing, a reservation, the writers' turn.
  local mark = held and string.sub(held, 1, 1)
  if held == false or mark == '~' or mark == '>' or mark == '^' then
    redis.call(ARGV[4], ARGV[2], ARGV[3])
  end
end
if removed > 0 then
  return 1
end
return 0
