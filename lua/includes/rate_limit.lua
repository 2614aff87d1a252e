--[[
  rate_limit: sliding windows over a session's and a license's recent
  requests, KEYS[13] and KEYS[14] (keys.lua). Members are
  "<entry id>:<now_ms>", scores the Redis clock.
]]
--- @include "keys"

-- Drops entries older than the window, counts, admits or refuses. Admitted
-- requests are recorded in both windows. A limit of 0 is no limit.
local function rate_limited(now, member, session_limit, license_limit, window)
  local windows = {{K.session_rate, session_limit}, {K.license_rate, license_limit}}
  for _, w in ipairs(windows) do
    if w[2] > 0 then
      rcall('ZREMRANGEBYSCORE', w[1], '-inf', now - window)
      if rcall('ZCARD', w[1]) >= w[2] then
        return true
      end
    end
  end
  for _, w in ipairs(windows) do
    if w[2] > 0 then
      rcall('ZADD', w[1], now, member)
      rcall('PEXPIRE', w[1], window)
    end
  end
  return false
end
