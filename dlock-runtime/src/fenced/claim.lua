-- Fenced claim: raise the highest fence seen for a resource, so that every older holder's
-- write is rejected from now on (a holder claims before it reads).
--
-- KEYS[1]  the resource's hash (see write.lua): only `seen` changes
-- ARGV[1]  the claimer's fence: a u64 in decimal, without leading zeros
--
-- Returns 1 claimed (the fence is at least every fence seen; an equal fence is accepted),
-- 0 rejected (a higher fence was seen: a newer holder exists; the hash is left as it was).
--
-- Fences are compared as decimal strings, as in write.lua.
local function below(a, b)
  return #a < #b or (#a == #b and a < b)
end
local seen = redis.call('HGET', KEYS[1], 'seen')
if seen and below(ARGV[1], seen) then
  return 0
end
redis.call('HSET', KEYS[1], 'seen', ARGV[1])
return 1
