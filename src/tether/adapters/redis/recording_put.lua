-- Store a recording unless the conversation's fence is above its epoch.
--
-- The fence is the highest epoch of any accepted put or fence call; it lives in
-- a string without TTL beside the record, so the record's delete or expiry never
-- lowers it. Without one the fence is 0. (A record written before that key
-- existed fences by its own epoch too.)
--
-- KEYS[1]   the record (hash: epoch, message_id, event JSON)
-- KEYS[2]   the fence (decimal string, no TTL)
-- ARGV[1]   epoch (decimal, within +-2^53 so Lua numbers compare it exactly)
-- ARGV[2]   message_id        ARGV[3]   the event JSON
-- ARGV[4]   TTL in seconds, refreshed on every put
-- ARGV[5]   the change channel
-- ARGV[6]   the announcement (the conversation and its kind of change),
--           published when the record is written
--
-- Returns {1, epoch} when written, {0, the fence} when fenced.

local epoch = tonumber(ARGV[1])
local fence = redis.call('GET', KEYS[2]) or '0' -- no fence yet: 0
if tonumber(fence) == nil then
  return redis.error_reply('CORRUPT recording fence ' .. fence .. ': ' .. KEYS[2])
end
if epoch < tonumber(fence) then
  return {0, fence}
end
local stored = redis.call('HGET', KEYS[1], 'epoch')
if stored == false then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return redis.error_reply('CORRUPT recording without an epoch: ' .. KEYS[1])
  end
else
  local current = tonumber(stored)
  if current == nil then
    return redis.error_reply('CORRUPT recording epoch ' .. stored .. ': ' .. KEYS[1])
  end
  if epoch < current then
    return {0, stored}
  end
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'message_id', ARGV[2], 'event', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return {1, ARGV[1]}
