-- A reader's release (see read_acquire.lua), only for its owner. The last reader out deletes
-- the readers' mark, or, when somebody outside waits (`+`), reserves the key for the waiters
-- of every other runtime and publishes, as release.lua does for a writer; when a writer waits
-- (the mark's writer-waiting time is still ahead), the key becomes the writers' turn (`^`)
-- instead, so that a reader of another runtime cannot take it before the writer.
--
-- KEYS[1]  lock `<prefix>{<key>}`
-- KEYS[2]  readers `<prefix>{<key>}:readers`
-- ARGV[1]  owner token
-- ARGV[2]  release channel
-- ARGV[3]  message: the releasing runtime's id
-- ARGV[4]  publish command: PUBLISH or SPUBLISH
-- ARGV[5]  reservation in milliseconds
--
-- Returns 1 released, 0 not a reader (expired, or never was).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
local held = redis.call('GET', KEYS[1])
local is_mark = held and string.sub(held, 1, 1) == '='
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if last[2] then
  local ttl = math.max(tonumber(last[2]) - now, 1)
  redis.call('PEXPIRE', KEYS[2], ttl)
  if is_mark then redis.call('PEXPIRE', KEYS[1], ttl) end
  return 1
end
if is_mark then
  local flagged = string.sub(held, -1) == '+'
  local body = string.sub(held, 2)
  if flagged then body = string.sub(body, 1, -2) end
  local writer_until = tonumber(body) or 0
  if writer_until > now then
    -- A writer waits: the key becomes the writers' turn (`^`, see acquire.lua) until its
    -- waiting time ends; readers keep waiting behind it, whatever runtime they are of. The
    -- mark's flag is the waiting writers' (acquire.lua sets it), answered by this message:
    -- the turn starts unflagged, else the writer that takes it would keep a flag set by its
    -- own wait, and its release would reserve the key for waiters that do not exist. Whoever
    -- waits from now on flags the turn, or the writer's lock, itself.
    redis.call('SET', KEYS[1], '^', 'PX', writer_until - now)
    if flagged then redis.call(ARGV[4], ARGV[2], ARGV[3]) end
  elseif flagged then
    redis.call('SET', KEYS[1], '~' .. ARGV[3], 'PX', ARGV[5])
    redis.call(ARGV[4], ARGV[2], ARGV[3])
  else
    redis.call('DEL', KEYS[1])
  end
end
return 1
