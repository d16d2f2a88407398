-- Acquire a fair lock (strict FIFO across processes): the lock goes to the first waiter of the
-- key's queue, and a waiter that stops refreshing its place (its process died) loses it once
-- its place's deadline passes, so it never blocks the line.
--
-- KEYS[1]  lock `<prefix>{<key>}` (see acquire.lua: the owner token, `+` appended when a waiter
--          of another runtime asked to be notified; `><runtime id>` or `~<runtime id>` for a
--          moment after a flagged release, or `^`, the writers' turn after the last reader
--          left while a writer waited (read_release.lua), each with `+` appended when flagged:
--          all free for a fair lock, whose queue decides who is next, and taken with their
--          flag; a fair lock is a writer)
-- KEYS[2]  fence counter `<prefix>{<key>}:fence`
-- KEYS[3]  queue `<prefix>{<key>}:queue`: a list of owner tokens, first in line first
-- KEYS[4]  places `<prefix>{<key>}:places`: a sorted set, owner token -> the deadline of its
--          place in the queue (server clock, milliseconds)
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  fence counter TTL in milliseconds (the lease plus a margin)
-- ARGV[4]  the lowest fence a counter that was not recreated can hold (see acquire.lua)
-- ARGV[5]  fence block (see acquire.lua)
-- ARGV[6]  this runtime's id
-- ARGV[7]  how long a place lasts past this call, in milliseconds; 0: a try that does not
--          join the line (no wait)
-- ARGV[8]  writer waiting, in milliseconds (acquire.lua's ARGV[7]): how long the first in line
--          that finds readers holding (their mark `=<until>`, read_acquire.lua) keeps new
--          readers out, as a plain writer does
--
-- Returns one integer, as acquire.lua: the last token of the fence block when acquired (or
-- already this owner's), else -2 - ms to wait before the next attempt: the holder's remaining
-- lease (when readers hold and this waiter is first in line, at most half the writer waiting,
-- so that it looks again before its mark lapses), or, when the lock is free but another waiter
-- is first in line, until that waiter's place runs out (it is told of the release and takes
-- its turn before that if alive).
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
-- Waiters whose place ran out leave the line.
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms)
for _, waiter in ipairs(gone) do
  redis.call('LREM', KEYS[3], 0, waiter)
  redis.call('ZREM', KEYS[4], waiter)
end
local held = redis.call('GET', KEYS[1])
local turn = held ~= false and string.sub(held, 1, 1) == '^'
local free = held == false or turn or string.sub(held, 1, 1) == '~'
  or string.sub(held, 1, 1) == '>'
local ours = held == ARGV[1] or held == ARGV[1] .. '+'
local first = redis.call('LINDEX', KEYS[3], 0)
if ours or (free and (first == false or first == ARGV[1])) then
  -- Taking the writers' turn or a reservation keeps its flag, as acquire.lua does: the
  -- waiters of other runtimes that flagged it (readers during the turn) are still told of
  -- this release. So does a retry of this owner's acquisition. A reservation for one
  -- runtime (`>`) was made for a runtime in line (acquire.lua), which still waits: flagged.
  local flagged = held ~= false
    and (string.sub(held, -1) == '+' or string.sub(held, 1, 1) == '>')
  redis.call('SET', KEYS[1], flagged and ARGV[1] .. '+' or ARGV[1], 'PX', ARGV[2])
  redis.call('LREM', KEYS[3], 0, ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  return reserve_block(KEYS[2], ARGV[5], ARGV[4], ARGV[3], now)
end
-- Join the line (or keep the place): the queue and the places live as long as a place does.
-- A place of 0 is a try without waiting: it does not join.
local place = tonumber(ARGV[7])
if place > 0 then
  if redis.call('ZADD', KEYS[4], now_ms + place, ARGV[1]) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[1])
  end
  local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
  local keep = math.max(place, tonumber(last[2]) - now_ms)
  redis.call('PEXPIRE', KEYS[3], keep)
  redis.call('PEXPIRE', KEYS[4], keep)
end
if free then
  -- The first in line has until its place runs out to take its turn.
  local until_ms = redis.call('ZSCORE', KEYS[4], first)
  return -2 - math.max(0, (tonumber(until_ms) or now_ms) - now_ms)
end
-- Readers hold and this waiter is first in line: mark a writer waiting as acquire.lua does
-- (new readers queue behind it until then, and the last reader's release leaves the key to
-- the writers, `^`), flagged so that that release notifies, and look again before the mark
-- lapses. A try without waiting does not keep readers out.
if string.sub(held, 1, 1) == '=' and place > 0 and (first == false or first == ARGV[1]) then
  redis.call('SET', KEYS[1], string.format('=%d+', now_ms + tonumber(ARGV[8])), 'KEEPTTL')
  local pttl = math.max(redis.call('PTTL', KEYS[1]), 0)
  return -2 - math.min(pttl, math.floor(tonumber(ARGV[8]) / 2))
end
-- Ask the holder's release to publish (unless it is of this runtime, which wakes its own
-- waiters without a message), as acquire.lua does.
if string.sub(held, -1) ~= '+' and string.sub(held, 1, #ARGV[6]) ~= ARGV[6] then
  redis.call('SET', KEYS[1], held .. '+', 'KEEPTTL')
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then
  return -1
end
return -2 - pttl
