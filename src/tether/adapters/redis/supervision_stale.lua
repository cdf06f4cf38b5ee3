-- The RUNNING rows whose heartbeat is older than a bound, oldest first
-- (list_stale_running): read from the sorted set the supervision scripts keep,
-- so the work is the rows listed, however many turns are live.
--
-- supervision_cas.lua adds a conversation to the set, scored by its heartbeat,
-- whenever it writes a RUNNING row, and stamps the row's 'indexed' field with
-- that write's token; its other writes and supervision_delete.lua remove it.
-- A member can still outlive what it stood for: its row expired (the rows'
-- TTL), or was last written by a script that keeps no set (a replica of an
-- earlier release during a rolling deploy: the row's token is then not the
-- one in 'indexed'). Such members are removed here as they are met, and not
-- listed; a row written since by a current replica is in the set again.
--
-- The row keys are built from the members, not passed in KEYS: like every key
-- of this layout, they share the set's hash slot only if the prefix carries a
-- hash tag (the backend takes a standalone or Sentinel-managed server).
--
-- KEYS[1]   the set of RUNNING rows by heartbeat (member: the escaped conversation)
-- ARGV[1]   the key of a row without its conversation ('{prefix}stream-supervision:')
-- ARGV[2]   the bound, exclusive: microseconds since 1970 (a decimal)
-- ARGV[3]   at most this many rows (> 0)
-- ARGV[4]   stop once this many members were removed (bounds the script's run
--           after a mass expiry; the next call goes on from there)
--
-- Returns, flat and oldest first, for each row listed: the member, the row's
-- epoch field and its row field ('' where missing: the caller reports the
-- row as corrupt).

local heartbeats, rows = KEYS[1], ARGV[1]
local bound = '(' .. ARGV[2]
local limit, cleanup = tonumber(ARGV[3]), tonumber(ARGV[4])
local listed, found, removed = {}, 0, 0
while found < limit and removed < cleanup do
  -- Every member before the found ones' end was listed or removed: start there.
  local members = redis.call('ZRANGEBYSCORE', heartbeats, '-inf', bound,
    'LIMIT', found, limit - found)
  if #members == 0 then
    break
  end
  for _, member in ipairs(members) do
    local stored = redis.call('HMGET', rows .. member, 'epoch', 'row', 'token', 'indexed')
    if stored[3] and stored[3] == stored[4] then
      found = found + 1
      listed[#listed + 1] = member
      listed[#listed + 1] = stored[1] or ''
      listed[#listed + 1] = stored[2] or ''
    else
      redis.call('ZREM', heartbeats, member)
      removed = removed + 1
    end
  end
end
return listed
