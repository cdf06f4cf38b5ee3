-- Raise a conversation's recording fence: refuse every later put below this epoch.
--
-- The record itself is unchanged (nothing is published); the fence never goes
-- down. A fence on a conversation without a record holds all the same.
--
-- KEYS[1]   the fence (decimal string, no TTL)
-- ARGV[1]   epoch (decimal, within +-2^53 so Lua numbers compare it exactly)
--
-- Returns the fence after the call (decimal string).

local fence = redis.call('GET', KEYS[1]) or '0' -- no fence yet: 0
if tonumber(fence) == nil then
  return redis.error_reply('CORRUPT recording fence ' .. fence .. ': ' .. KEYS[1])
end
if tonumber(ARGV[1]) <= tonumber(fence) then
  return fence
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
