-- Raise a conversation's checkpoint fence: refuse every later fenced save below
-- this epoch. The checkpoint itself is unchanged; the fence never goes down, and
-- holds on a conversation without a checkpoint too; without one it is 0.
-- (Prepended: _epochs.lua.)
--
-- KEYS[1]   the fence (decimal string, no TTL)
-- ARGV[1]   epoch (decimal)
--
-- Returns the fence after the call (decimal string).

local fence = epoch_at(KEYS[1])
if above(ARGV[1], fence) then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return fence
