-- Restart a recreated fence counter at the server clock (see acquire.lua), for a holder whose
-- first attempt (the plain pipeline) drew a value below the lowest a counter that was not
-- recreated can hold. Runs while the caller holds the lock: attempts of others can only raise
-- the counter meanwhile.
--
-- KEYS[1]  fence counter
-- ARGV[1]  fence counter TTL in milliseconds
-- ARGV[2]  fence block (see acquire.lua)
--
-- Returns the last token of the holder's block: its first token is above everything the
-- counter gave out and above the server clock in microseconds.
local fence = redis.call('INCRBY', KEYS[1], ARGV[2])
local now = redis.call('TIME')
fence = math.max(fence, tonumber(now[1]) * 1000000 + tonumber(now[2]) + tonumber(ARGV[2]))
redis.call('SET', KEYS[1], string.format('%d', fence), 'PX', ARGV[1])
return fence
