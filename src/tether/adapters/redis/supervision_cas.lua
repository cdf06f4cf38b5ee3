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
-- the row. A replaced turn's key is left to expire: the lookup checks the row.
--
-- KEYS[3 * i - 2]   the row of swap i
-- KEYS[3 * i - 1]   the highest epoch of swap i's conversation
-- KEYS[3 * i]       the index key of swap i's new message_id
-- ARGV[1]   TTL in seconds, set on every row written (rows of dead turns expire)
-- ARGV[2]   the change channel
-- ARGV[3]   a token unique to this call
-- ARGV[4 + 6 * (i - 1) + n] for swap i:
--   n = 0  the expected epoch, '' for "only if no row exists"
--   n = 1  the new epoch      n = 2  the new message_id     n = 3  the new row JSON
--   n = 4  the announcement (the conversation and its kind of change), published
--          on the channel when the row is written at a new epoch: a claim, a
--          takeover, a verdict; not a heartbeat (the same epoch)
--   n = 5  the session id (percent-encoded), stored at the index key
--
-- Returns one integer per swap: 1 written, 0 refused.

local ttl, channel, call = ARGV[1], ARGV[2], ARGV[3]
local written = {}
for i = 1, #KEYS / 3 do
  local key, epoch_key, index_key = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local at = 4 + 6 * (i - 1)
  local expected, epoch = ARGV[at], ARGV[at + 1]
  local token = call .. '#' .. i
  local stored = redis.call('HMGET', key, 'epoch', 'token')
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
    redis.call('HSET', key, 'epoch', epoch, 'message_id', ARGV[at + 2],
      'row', ARGV[at + 3], 'token', token)
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
