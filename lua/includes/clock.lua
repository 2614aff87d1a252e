--[[
  clock: one clock for every worker, the Redis server's, so no two workers
  disagree about who is stale.
]]

-- The Redis server's time in unix ms.
local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
