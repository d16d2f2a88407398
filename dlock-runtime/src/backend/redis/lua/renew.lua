-- Renew a batch of leases, each only for its owner, and keep each key's fence counter alive
-- beyond its lock (see acquire.lua: the counter must outlive every lock on the key).
--
-- KEYS[2i-1]   lock of the i-th lock (the owner token, `+` appended when flagged)
-- KEYS[2i]     fence counter of the i-th lock
-- ARGV[1]      margin in milliseconds the fence counter outlives the lease by
-- ARGV[2i]     owner token of the i-th lock
-- ARGV[2i+1]   lease in milliseconds of the i-th lock
--
-- Returns a table with one entry per lock: 1 renewed, 0 no longer held by that owner. A key
-- that holds another type (another application wrote there) answers 0 for that key alone:
-- `pcall` keeps its WRONGTYPE error from failing the whole batch.
local result = {}
local margin = tonumber(ARGV[1])
for i = 1, #KEYS / 2 do
  local lock, counter = KEYS[2 * i - 1], KEYS[2 * i]
  local owner = ARGV[2 * i]
  local held = redis.pcall('GET', lock)
  if held == owner or held == owner .. '+' then
    local lease = tonumber(ARGV[2 * i + 1])
    redis.call('PEXPIRE', lock, lease)
    redis.call('PEXPIRE', counter, lease + margin)
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
