-- Renew a batch of readers or semaphore permits, each only for its owner, and keep each key's
-- fence counter alive beyond them (see renew.lua).
--
-- KEYS[3i-2]  the i-th holder's set: readers `<prefix>{<key>}:readers` or permits
--             `<prefix>{<key>}:permits`, owner tokens scored by expiry (server ms)
-- KEYS[3i-1]  its companion, which lives as long as the set: the lock string holding the
--             readers' mark (`=...`), or the semaphore's size `<prefix>{<key>}:permits:n`
-- KEYS[3i]    fence counter
-- ARGV[1]     margin in milliseconds the fence counter outlives the lease by
-- ARGV[2i]    owner token of the i-th holder
-- ARGV[2i+1]  lease in milliseconds of the i-th holder
--
-- Returns one entry per holder: 1 renewed, 0 no longer held by that owner.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local margin = tonumber(ARGV[1])
local result = {}
for i = 1, #KEYS / 3 do
  local set, companion, counter = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local owner, lease = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  local score = redis.pcall('ZSCORE', set, owner)
  if type(score) == 'string' and tonumber(score) > now then
    redis.call('ZADD', set, 'XX', now + lease, owner)
    local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
    local ttl = math.max(tonumber(last[2]) - now, 1)
    redis.call('PEXPIRE', set, ttl)
    local value = redis.pcall('GET', companion)
    if type(value) == 'string' and string.sub(value, 1, 1) ~= '~' then
      redis.call('PEXPIRE', companion, ttl)
    end
    redis.call('PEXPIRE', counter, lease + margin)
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
