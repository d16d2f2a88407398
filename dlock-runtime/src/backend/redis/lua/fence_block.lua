-- Put in front of acquire.lua, extend.lua and fair_acquire.lua (`script.rs`): the one place
-- that reserves a block of fencing tokens for an acquisition.
--
-- reserve_block(counter, block, floor, ttl, now)
--   counter  the fence counter `<prefix>{<key>}:fence`
--   block    how many consecutive tokens to reserve (INCRBY)
--   floor    the lowest value a counter that was not recreated can hold (see `script.rs`)
--   ttl      the counter's TTL in milliseconds (the lease plus a margin)
--   now      optional: the server's TIME, when the script has read it already
--
-- Returns the LAST token of the block. A counter below the floor was recreated and starts
-- again at the server clock in microseconds (see acquire.lua, Fencing); otherwise its expiry
-- is pushed to `ttl` from now.
local function reserve_block(counter, block, floor, ttl, now)
  local fence = redis.call('INCRBY', counter, block)
  if fence < tonumber(floor) then
    now = now or redis.call('TIME')
    fence = math.max(fence, tonumber(now[1]) * 1000000 + tonumber(now[2]) + tonumber(block))
    redis.call('SET', counter, string.format('%d', fence), 'PX', ttl)
  else
    redis.call('PEXPIRE', counter, ttl)
  end
  return fence
end
