-- Delete a supervision row only if it still holds exactly this turn at this epoch.
--
-- KEYS[1]   the row (hash: epoch, message_id, row, token)
-- ARGV[1]   message_id        ARGV[2]   epoch (decimal)
-- ARGV[3]   the change channel
-- ARGV[4]   the conversation, published when the row is removed
--
-- Returns 1 if the row was removed, 0 if it was left alone (or absent).

local stored = redis.call('HMGET', KEYS[1], 'message_id', 'epoch')
if stored[1] == ARGV[1] and stored[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
return 0
