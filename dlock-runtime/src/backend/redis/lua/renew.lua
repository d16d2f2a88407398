-- Renew a batch of leases, each only for its owner.
--
-- KEYS[i]      lock hash of the i-th lock
-- ARGV[2i-1]   owner token of the i-th lock
-- ARGV[2i]     lease in milliseconds of the i-th lock
--
-- Returns a table with one entry per key: 1 renewed, 0 no longer held by that owner. A key
-- that holds another type (another application wrote there) answers 0 for that key alone:
-- `pcall` keeps its WRONGTYPE error from failing the whole batch.
local result = {}
for i = 1, #KEYS do
  if redis.pcall('HGET', KEYS[i], 'owner') == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
