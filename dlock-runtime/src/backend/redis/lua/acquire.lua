-- Acquire a lock while waiting for it (the first attempt is the plain pipeline in
-- `exclusive.rs`), idempotent per owner token; when it is held by somebody else, flag it so
-- that its release notifies.
--
-- KEYS[1]  lock `<prefix>{<key>}`: a string, the owner token, with `+` appended once somebody
--          outside the holder's process waits (the release then publishes; without it, it
--          does not); or, for a moment after a flagged release, `><runtime id>`: reserved for
--          the waiters of that runtime, whose turn it is (release.lua), or `~<runtime id>`:
--          reserved for the waiters of every other runtime (no runtime was in line); or `^`
--          (`+` appended when flagged): the writers' turn after the last reader left while a
--          writer waited (read_release.lua), free for any writer, not for readers
-- KEYS[2]  fence counter `<prefix>{<key>}:fence`
-- KEYS[3]  turns `<prefix>{<key>}:turns`: the runtimes waiting for the key, a sorted set of
--          runtime ids scored by when each joined (in microseconds: ARGV[8], else the server's
--          clock); a flagged release reserves the key for the first of them (release.lua), so
--          that the processes contending for a key take turns in the order they came
-- ARGV[1]  owner token (32 hex digits: the runtime id, then 64 random bits)
-- ARGV[2]  lease in milliseconds (the lock's TTL)
-- ARGV[3]  fence counter TTL in milliseconds: the lease plus a margin
-- ARGV[4]  the lowest fence a counter that was not recreated can hold (see `script.rs`)
-- ARGV[5]  fence block: how many consecutive tokens an acquisition reserves (the runtime
--          hands the lock to its own waiters with the others, see `script.rs`)
-- ARGV[6]  this runtime's id
-- ARGV[7]  writer waiting, in milliseconds: how long a writer that finds readers holding
--          (their mark `=<until>`, read_acquire.lua) keeps new readers out
-- ARGV[8]  optional: this runtime's place in the line if it joins now, the client's clock in
--          microseconds (Redlock: the same on every node, so that they order runtimes alike;
--          without it, one server's clock orders them, whatever the clients' clocks say)
--
-- Returns one integer (cheaper than a table):
--         fence > 0     acquired, the LAST token of the reserved block (or already held by
--                       this owner: a retry of the same request; its TTL runs from the first,
--                       and the runtime counts from before that)
--         -1            held by another owner, with no TTL on the key
--         -2 - pttl     held by another owner (or reserved for other runtimes) whose lease
--                       has pttl ms left
--
-- Fencing: the counter only grows (INCR) while it exists, and every acquisition and renewal
-- pushes its expiry to ARGV[3] from now. A value below ARGV[4] means it was recreated (first
-- use, that margin passed with the key unused, or the server lost its data): it then starts
-- again at the server clock in microseconds, above every token an earlier counter of this key
-- gave out (that one started at its own creation time in microseconds and grew by one per
-- attempt, far slower than one per microsecond) unless the clock was stepped back by more than
-- the time since that earlier counter was created.
local held = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
local flagged = false
if held ~= false and string.sub(held, 1, 1) == '^' then
  -- The writers' turn: the last reader left while a writer waited (read_release.lua); any
  -- writer takes it, keeping the flag of the readers that wait meanwhile.
  flagged = string.sub(held, -1) == '+'
  redis.call('SET', KEYS[1], flagged and ARGV[1] .. '+' or ARGV[1], 'PX', ARGV[2])
  held = false
elseif held ~= false and string.sub(held, 1, 1) == '>' then
  -- This runtime's turn, reserved by a flagged release: taken, flagged again when other
  -- runtimes are still in line. Another runtime's turn: waited for (below).
  flagged = string.sub(held, -1) == '+'
  local to = flagged and string.sub(held, 2, -2) or string.sub(held, 2)
  if to == ARGV[6] then
    redis.call('ZREM', KEYS[3], ARGV[6])
    flagged = flagged or redis.call('ZCARD', KEYS[3]) > 0
    redis.call('SET', KEYS[1], flagged and ARGV[1] .. '+' or ARGV[1], 'PX', ARGV[2])
    held = false
  end
elseif held ~= false and string.sub(held, 1, 1) == '~' then
  -- Reserved after a flagged release: for every runtime but the one that released.
  flagged = string.sub(held, -1) == '+'
  local by = flagged and string.sub(held, 2, -2) or string.sub(held, 2)
  if by ~= ARGV[6] then
    redis.call('ZREM', KEYS[3], ARGV[6])
    redis.call('SET', KEYS[1], flagged and ARGV[1] .. '+' or ARGV[1], 'PX', ARGV[2])
    held = false
  end
end
if held == false or held == ARGV[1] or held == ARGV[1] .. '+' then
  if held ~= false then
    -- A retry of this owner's acquisition (its earlier request landed late, after the runtime
    -- gave up on it): the lease counts from this request, as the runtime counts it.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return reserve_block(KEYS[2], ARGV[5], ARGV[4], ARGV[3])
end
-- Readers hold: mark a writer waiting (new readers queue behind it until then), flagged so
-- that the last reader's release notifies, and look again before the mark lapses.
if string.sub(held, 1, 1) == '=' then
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  redis.call('SET', KEYS[1], string.format('=%d+', ms + tonumber(ARGV[7])), 'KEEPTTL')
  local pttl = math.max(redis.call('PTTL', KEYS[1]), 0)
  return -2 - math.min(pttl, math.floor(tonumber(ARGV[7]) / 2))
end
-- Flag it and take a place in the line of runtimes, unless the holder is of this runtime
-- (owner tokens start with the runtime id): its release wakes this waiter without a message,
-- and a flag would reserve the key for others.
if string.sub(held, 1, #ARGV[6]) ~= ARGV[6] then
  if string.sub(held, -1) ~= '+' then
    redis.call('SET', KEYS[1], held .. '+', 'KEEPTTL')
  end
  local place = ARGV[8]
  if place == nil then
    local now = redis.call('TIME')
    place = tonumber(now[1]) * 1000000 + tonumber(now[2])
  end
  redis.call('ZADD', KEYS[3], 'NX', place, ARGV[6])
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then
  return -1
end
return -2 - pttl
