-- Fenced write: store a resource's value unless a higher fence was already seen for it.
--
-- KEYS[1]  the resource's hash: `value`, `fence` (the fence `value` was written with) and
--          `seen` (the highest fence any accepted write or claim presented)
-- ARGV[1]  the value
-- ARGV[2]  the writer's fence: a u64 in decimal, without leading zeros
--
-- Returns 1 written (the fence is at least every fence seen; an equal fence is accepted, so one
-- holder may write many times), 0 rejected (a higher fence was seen: a newer holder exists; the
-- hash is left as it was).
--
-- Fences are compared as decimal strings, by length and then digit by digit: Lua numbers are
-- doubles, exact only up to 2^53, and a u64 fence may be larger.
local function below(a, b)
  return #a < #b or (#a == #b and a < b)
end
local seen = redis.call('HGET', KEYS[1], 'seen')
if seen and below(ARGV[2], seen) then
  return 0
end
redis.call('HSET', KEYS[1], 'value', ARGV[1], 'fence', ARGV[2], 'seen', ARGV[2])
return 1
