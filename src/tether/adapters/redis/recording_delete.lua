-- Delete a recording only if it still belongs to this turn.
--
-- KEYS[1]   the record (hash: epoch, message_id, event)
-- ARGV[1]   message_id
-- ARGV[2]   the change channel
-- ARGV[3]   the conversation, published when the record is removed
--
-- Returns 1 if the record was removed, 0 if it was left alone (or absent).

if redis.call('HGET', KEYS[1], 'message_id') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
