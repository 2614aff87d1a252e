--[[
  clock: one clock for every worker, the Redis server's, so no two workers
  disagree about who is stale.
]]

-- `n` (a time or count in ms, a whole number) as a command argument. Lua
-- hands Redis a number written with '%.17g', several times slower than
-- '%d' for a 13-digit time; an argument that is a constant is best a
-- string literal. A `string.format` costs about 1.9 thousand instructions
-- (ops/callgrind.sh), so the last numbers written are kept (in the
-- function library, from call to call): a call writes its clock two or
-- three times (a seat's score, its session record, its event) and a
-- license's seat counts repeat from call to call. At most FORMATTED_MAX
-- are kept; past that the cache starts afresh.
local FORMATTED_MAX = 64
local formatted, formatted_count = {}, 0
local function ms(n)
  local s = formatted[n]
  if not s then
    s = string.format('%d', n)
    if n ~= n then
      return s -- NaN, no table key
    end
    if formatted_count >= FORMATTED_MAX then
      formatted, formatted_count = {}, 0
    end
    formatted[n] = s
    formatted_count = formatted_count + 1
  end
  return s
end

-- The Redis server's time in unix ms.
local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
