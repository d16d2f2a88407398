-- Acquire several locks at once for one owner, all or nothing (a multi-key lock whose keys
-- live on one server or one Cluster hash slot): when every lock is free, take them all and
-- draw each one's fence block; when one is held by somebody else, take none.
--
-- KEYS[2i-1]  lock of the i-th key `<prefix>{<key>}` (see acquire.lua: the owner token, `+`
--             appended when flagged; `~<runtime id>` reserved after a flagged release for the
--             waiters of every other runtime, or `^` the writers' turn after the last reader
--             left while a writer waited, both free for this writer as for acquire.lua's, and
--             taken keeping their `+` when flagged, so that the waiters that flagged them are
--             told of the release; `><runtime id>`, one runtime's turn, is free for that
--             runtime only (and taken flagged: other runtimes may still be in line); the
--             readers' mark `=<until>` is busy: this try takes no place in the line of
--             runtimes and does not mark a writer waiting)
-- KEYS[2i]    fence counter of the i-th key `<prefix>{<key>}:fence`
-- ARGV[1]     owner token
-- ARGV[2]     lease in milliseconds
-- ARGV[3]     fence counter TTL in milliseconds (the lease plus a margin)
-- ARGV[4]     the lowest fence a counter that was not recreated can hold (see acquire.lua)
-- ARGV[5]     fence block (see acquire.lua)
-- ARGV[6]     this runtime's id
--
-- Returns a table: {1, last token of key 1's block, last token of key 2's, ...} when all were
-- taken (or already this owner's: a retry), or {0, i, pttl} when the i-th key is held by
-- somebody else (pttl -1 when it has no TTL), nothing taken.
local n = #KEYS / 2
local flagged = {}
for i = 1, n do
  local held = redis.call('GET', KEYS[2 * i - 1])
  if held ~= false then
    flagged[i] = string.sub(held, -1) == '+'
    local body = flagged[i] and string.sub(held, 1, -2) or held
    local kind = string.sub(body, 1, 1)
    -- Free: already this owner's (a retry), the writers' turn, a reservation for the other
    -- runtimes after a flagged release, or one for this runtime's turn (which leaves it
    -- flagged: other runtimes may still be in the key's line).
    local free = body == ARGV[1] or kind == '^'
      or (kind == '~' and string.sub(body, 2) ~= ARGV[6])
      or (kind == '>' and string.sub(body, 2) == ARGV[6])
    flagged[i] = flagged[i] or kind == '>'
    if not free then
      return {0, i, redis.call('PTTL', KEYS[2 * i - 1])}
    end
  end
end
local answer = {1}
for i = 1, n do
  redis.call('SET', KEYS[2 * i - 1], flagged[i] and ARGV[1] .. '+' or ARGV[1], 'PX', ARGV[2])
  local counter = KEYS[2 * i]
  local fence = redis.call('INCRBY', counter, ARGV[5])
  if fence < tonumber(ARGV[4]) then
    local now = redis.call('TIME')
    fence = math.max(fence, tonumber(now[1]) * 1000000 + tonumber(now[2]) + tonumber(ARGV[5]))
    redis.call('SET', counter, string.format('%d', fence), 'PX', ARGV[3])
  else
    redis.call('PEXPIRE', counter, ARGV[3])
  end
  answer[i + 1] = fence
end
return answer
