-- Read locks for an operator (inspect, list): each lock's value and remaining TTL, at one
-- instant. Changes nothing.
--
-- KEYS[i]  lock `<prefix>{<key>}` (see acquire.lua: the owner token, `+` appended when
--          flagged, or `~<runtime id>` for a moment after a flagged release)
--
-- Returns two tables with one entry per key: the values ('' when the key is missing or holds
-- another type: `pcall` keeps a WRONGTYPE error from failing the whole read) and the PTTLs in
-- milliseconds (-2 missing, -1 no expiry).
local values, ttls = {}, {}
for i = 1, #KEYS do
  local held = redis.pcall('GET', KEYS[i])
  if type(held) ~= 'string' then
    held = ''
  end
  values[i] = held
  ttls[i] = redis.call('PTTL', KEYS[i])
end
return {values, ttls}
