-- Fenced claim: raise the highest fence seen for a resource, so that every older holder's
-- write is rejected from now on (a holder claims before it reads).
--
-- KEYS[1]  the resource's hash (see write.lua): only `seen` changes
-- ARGV[1]  the claimer's fence: a u64 in decimal, without leading zeros
--
-- Returns 1 claimed (the fence is at least every fence seen; an equal fence is accepted),
-- 0 rejected (a higher fence was seen: a newer holder exists; the hash is left as it was).
--
-- The fence comparison is `stale` (stale.lua).
if stale(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'seen', ARGV[1])
return 1
