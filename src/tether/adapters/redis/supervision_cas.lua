-- Compare-and-swap of supervision rows: one swap, or a batch in one round trip.
--
-- A row is a hash: epoch (decimal), message_id, row (the JSON document), token.
-- Beside it, a string without TTL holds the highest epoch ever written for the
-- conversation; every accepted swap raises it, so the row's delete or expiry
-- never loses it, and a claim of a conversation with no row (expected '') is
-- refused unless its epoch is above it. Each swap is decided on its own, in
-- order, so a batch behaves exactly like the same swaps made one by one; it is
-- not a transaction across rows. (Prepended: _epochs.lua.)
--
-- Beside that, a string with the row's TTL maps the row's turn to its session
-- (find_by_message_id): set with every accepted swap, so it lives as long as
-- the row. A swap that replaces the row's turn deletes the replaced turn's key
-- (if it still names this session): it names the tenant, the requester and the
-- turn, and an erase, whose tombstone replaces the last turn, must leave none.
--
-- And one sorted set holds the conversations whose row is RUNNING, scored by
-- the heartbeat (list_stale_running, see supervision_stale.lua): every
-- accepted swap that writes a RUNNING row adds its conversation at the new
-- heartbeat and stamps the row's 'indexed' field with the swap's token (the
-- listing trusts a member only while the row's token is still that one);
-- every other accepted swap removes it.
--
-- KEYS[1]           the set of RUNNING rows by heartbeat
-- KEYS[3 * i - 1]   the row of swap i
-- KEYS[3 * i]       the highest epoch of swap i's conversation
-- KEYS[3 * i + 1]   the index key of swap i's new message_id
-- ARGV[1]   TTL in seconds, set on every row written (rows of dead turns expire)
-- ARGV[2]   the change channel
-- ARGV[3]   a token unique to this call
-- ARGV[4 + 8 * (i - 1) + n] for swap i:
--   n = 0  the expected epoch, '' for "only if no row exists"
--   n = 1  the new epoch      n = 2  the new message_id     n = 3  the new row JSON
--   n = 4  the announcement (the conversation and its kind of change), published
--          on the channel when the row is written at a new epoch: a claim, a
--          takeover, a verdict; not a heartbeat (the same epoch)
--   n = 5  the session id (percent-encoded), stored at the index key
--   n = 6  the conversation (escaped, as in the keys): the member of the set
--   n = 7  the new heartbeat in microseconds since 1970 (a decimal, exact in
--          the set's double up to 2^53, the year 2255) if the new row is
--          RUNNING, '' if not
--   n = 8  the index key of the swap's requester without its message id
--          ('{prefix}supervision-message:{tenant}:{requester}:', escaped):
--          the replaced turn's index key is built from it (not in KEYS, as
--          supervision_stale.lua builds its row keys)
--
-- Returns one integer per swap: 1 written, 0 refused.

-- A message id escaped as the keys escape every id (``encode_part``: UTF-8
-- bytes, all but A-Za-z0-9_.-~ percent-encoded; %w is ASCII in Redis's C locale).
local function encode_part(value)
  return (string.gsub(value, '[^%w_%.%-~]', function(c)
    return string.format('%%%02X', string.byte(c))
  end))
end

local heartbeats = KEYS[1]
local ttl, channel, call = ARGV[1], ARGV[2], ARGV[3]
local written = {}
for i = 1, (#KEYS - 1) / 3 do
  local key, epoch_key, index_key = KEYS[3 * i - 1], KEYS[3 * i], KEYS[3 * i + 1]
  local at = 4 + 9 * (i - 1)
  local expected, epoch = ARGV[at], ARGV[at + 1]
  local token = call .. '#' .. i
  local stored = redis.call('HMGET', key, 'epoch', 'token', 'message_id')
  local last = epoch_at(epoch_key)
  local matches
  if stored[2] == token then
    -- The client resent this very call after losing its reply (a retry on a
    -- timeout): the row is this swap's own write, so report it as written.
    matches = true
  elseif stored[1] == false then
    if redis.call('EXISTS', key) == 1 then
      return redis.error_reply('CORRUPT supervision row without an epoch: ' .. key)
    end
    -- No row: a claim, of an epoch never granted before (the row may be gone).
    matches = expected == '' and above(epoch, last)
  else
    -- Decimal strings written by the same client: string equality is exact for
    -- any integer, where a Lua number would round beyond 2^53.
    matches = stored[1] == expected
    if matches and string.find(stored[1], '^%-?%d+$') then
      last = highest(last, stored[1]) -- a row written before the epoch key existed
    end
  end
  if matches then
    local conversation, heartbeat = ARGV[at + 6], ARGV[at + 7]
    if stored[3] and stored[3] ~= ARGV[at + 2] and stored[2] ~= token then
      local replaced = ARGV[at + 8] .. encode_part(stored[3])
      if redis.call('GET', replaced) == ARGV[at + 5] then
        redis.call('DEL', replaced)
      end
    end
    if heartbeat ~= '' then
      redis.call('HSET', key, 'epoch', epoch, 'message_id', ARGV[at + 2],
        'row', ARGV[at + 3], 'token', token, 'indexed', token)
      -- The score is Redis's parse of the decimal: never a Lua number, whose
      -- tostring keeps 14 digits.
      redis.call('ZADD', heartbeats, heartbeat, conversation)
    else
      redis.call('HSET', key, 'epoch', epoch, 'message_id', ARGV[at + 2],
        'row', ARGV[at + 3], 'token', token)
      redis.call('ZREM', heartbeats, conversation)
    end
    redis.call('EXPIRE', key, ttl)
    redis.call('SET', epoch_key, highest(last, epoch))
    redis.call('SET', index_key, ARGV[at + 5], 'EX', ttl)
    if expected ~= epoch then
      redis.call('PUBLISH', channel, ARGV[at + 4])
    end
    written[i] = 1
  else
    written[i] = 0
  end
end
return written
