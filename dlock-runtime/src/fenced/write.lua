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
-- The fence comparison is `stale` (stale.lua).
if stale(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'value', ARGV[1], 'fence', ARGV[2], 'seen', ARGV[2])
return 1
