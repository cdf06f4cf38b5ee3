-- Move one number kept for ever (a fence, the highest epoch) from its key of
-- before tombstones, named by the conversation's ids, to its key named by the
-- tombstone (tether.domain.tombstones), keeping the higher of the two; then
-- delete the old key. Run once per old key when a replica opens the store, so
-- an upgraded store keeps every epoch and names no id. (Prepended: _epochs.lua.)
--
-- KEYS[1]   the old key (decimal string)
-- KEYS[2]   the new key (decimal string, no TTL)
--
-- Returns 1 if the old key was moved, 0 if it was gone already.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local old, new = epoch_at(KEYS[1]), epoch_at(KEYS[2])
if above(old, new) then
  redis.call('SET', KEYS[2], old)
end
redis.call('DEL', KEYS[1])
return 1
