-- Delete a supervision row only if it still holds exactly this turn at this epoch.
--
-- The conversation's highest epoch stays (raised to the row's, should an older
-- row have been written before that key existed). (Prepended: _epochs.lua.)
--
-- KEYS[1]   the row (hash: epoch, message_id, row, token)
-- KEYS[2]   the conversation's highest epoch (string, no TTL)
-- KEYS[3]   the index key of message_id (string: the session id), removed with the row
-- KEYS[4]   the set of RUNNING rows by heartbeat (see supervision_cas.lua): the
--           conversation leaves it with the row
-- ARGV[1]   message_id        ARGV[2]   epoch (decimal)
-- ARGV[3]   the change channel
-- ARGV[4]   the announcement (the conversation and its kind of change),
--           published when the row is removed
-- ARGV[5]   the conversation (escaped, as in the keys): its member in KEYS[4]
--
-- Returns 1 if the row was removed, 0 if it was left alone (or absent).

local stored = redis.call('HMGET', KEYS[1], 'message_id', 'epoch')
if stored[1] == ARGV[1] and stored[2] == ARGV[2] then
  local last = epoch_at(KEYS[2])
  if above(ARGV[2], last) then
    redis.call('SET', KEYS[2], ARGV[2])
  end
  redis.call('DEL', KEYS[1])
  redis.call('DEL', KEYS[3])
  redis.call('ZREM', KEYS[4], ARGV[5])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
return 0
