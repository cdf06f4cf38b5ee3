-- Exact epoch arithmetic, prepended to the scripts that compare epochs (see
-- _scripts.py); not a script of its own.
--
-- Epochs travel as canonical decimal strings (Python's str(int): no leading
-- zeros, '-' only before a nonzero number). Lua numbers are doubles and would
-- round beyond 2^53, so these compare the digits instead: exact for any integer.

-- Whether decimal a is above decimal b.
local function above(a, b)
  local a_negative, b_negative = string.byte(a, 1) == 45, string.byte(b, 1) == 45 -- '-'
  if a_negative ~= b_negative then
    return b_negative
  end
  if #a ~= #b then
    -- More digits: larger in size, so above unless both are negative.
    return (#a > #b) ~= a_negative
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return (x > y) ~= a_negative
    end
  end
  return false
end

-- The larger of decimals a and b.
local function highest(a, b)
  if above(b, a) then
    return b
  end
  return a
end

-- The epoch (decimal string) held in the string at key, '0' when it does not exist.
local function epoch_at(key)
  local value = redis.call('GET', key)
  if value == false then
    return '0'
  end
  if not string.find(value, '^%-?%d+$') then
    error(redis.error_reply('CORRUPT epoch ' .. value .. ': ' .. key))
  end
  return value
end
