-- Read locks for an operator (inspect, list): each lock's value and remaining TTL, and its
-- live readers and permit holders, at one instant. Changes nothing.
--
-- KEYS[3i-2]  lock `<prefix>{<key>}` (see acquire.lua: the owner token, `+` appended when
--             flagged, `~<runtime id>` for a moment after a flagged release, or the readers'
--             mark `=…` while readers hold, see read_acquire.lua)
-- KEYS[3i-1]  readers `<prefix>{<key>}:readers` (see read_acquire.lua)
-- KEYS[3i]    permits `<prefix>{<key>}:permits` (see permit_acquire.lua)
--
-- Returns one row per lock: {value, pttl, readers, reader, reader_ms, permits, permit,
-- permit_ms}: the value ('' when missing or of another type: `pcall` keeps a WRONGTYPE error
-- from failing the whole read) and its PTTL in ms (-2 missing, -1 no expiry); the number of
-- live readers, the one whose lease ends last ('' if none) and its ms left; the same of the
-- permit holders.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function live(set)
  local ok, count = pcall(redis.call, 'ZCOUNT', set, '(' .. now, '+inf')
  if not ok or type(count) ~= 'number' or count == 0 then return 0, '', 0 end
  local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
  return count, last[1], math.max(math.floor(tonumber(last[2]) - now), 1)
end
local rows = {}
for i = 1, #KEYS / 3 do
  local lock = KEYS[3 * i - 2]
  local held = redis.pcall('GET', lock)
  if type(held) ~= 'string' then
    held = ''
  end
  local readers, reader, reader_ms = live(KEYS[3 * i - 1])
  local permits, permit, permit_ms = live(KEYS[3 * i])
  rows[i] = {held, redis.call('PTTL', lock), readers, reader, reader_ms, permits, permit, permit_ms}
end
return rows
