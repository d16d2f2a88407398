-- The start of write.lua and claim.lua: `stale(fence)`, whether a fence higher than `fence`
-- was already seen for the resource's hash KEYS[1].
--
-- Fences are compared as decimal strings (without leading zeros), by length and then digit by
-- digit: Lua numbers are doubles, exact only up to 2^53, and a u64 fence may be larger.
local function stale(fence)
  local seen = redis.call('HGET', KEYS[1], 'seen')
  return seen and (#fence < #seen or (#fence == #seen and fence < seen))
end
