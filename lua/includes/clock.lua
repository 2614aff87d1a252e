--[[
  clock: one clock for every worker, the Redis server's, so no two workers
  disagree about who is stale.
]]

-- `n` (a time or count in ms) as a command argument. Lua hands Redis a
-- number written with '%.17g', several times slower than '%d' for a
-- 13-digit time; an argument that is a constant is best a string literal.
local function ms(n)
  return string.format('%d', n)
end

-- The Redis server's time in unix ms.
local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
