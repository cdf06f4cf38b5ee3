-- Save a checkpoint unless the conversation's fence is above its epoch.
--
-- The fence is the epoch of the last accepted fenced save, or of a higher fence
-- call; it lives in a string without TTL beside the checkpoint, so ``delete``
-- (and ``state_ttl``) never lowers it. (Prepended: _epochs.lua.)
--
-- KEYS[1]   the checkpoint (string, JSON)
-- KEYS[2]   the fence (decimal string, no TTL)
-- ARGV[1]   epoch (decimal)
-- ARGV[2]   the checkpoint JSON
-- ARGV[3]   TTL in seconds of the checkpoint, '' for none
--
-- Returns 1 when saved (the fence is then the epoch), 0 when fenced (nothing changed).

if above(epoch_at(KEYS[2]), ARGV[1]) then
  return 0
end
if ARGV[3] == '' then
  -- A plain SET also clears an expiry left by an earlier state_ttl.
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
end
redis.call('SET', KEYS[2], ARGV[1])
return 1
