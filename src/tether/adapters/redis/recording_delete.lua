-- Delete a recording only if it still belongs to this turn; its fence stays.
--
-- KEYS[1]   the record (hash: epoch, message_id, event)
-- KEYS[2]   the fence (decimal string, no TTL): raised to the record's epoch,
--           should the record have been written before that key existed
-- ARGV[1]   message_id
-- ARGV[2]   the change channel
-- ARGV[3]   the announcement (the conversation and its kind of change),
--           published when the record is removed
--
-- Returns 1 if the record was removed, 0 if it was left alone (or absent).

local stored = redis.call('HMGET', KEYS[1], 'message_id', 'epoch')
if stored[1] == ARGV[1] then
  local epoch = tonumber(stored[2])
  local fence = redis.call('GET', KEYS[2])
  -- A value this script cannot read is left as is (the next put reports it).
  if epoch ~= nil and (fence == false or (tonumber(fence) or epoch) < epoch) then
    redis.call('SET', KEYS[2], stored[2])
  end
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
