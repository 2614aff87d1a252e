--[[
  license: reading the license record, KEYS[1] (keys.lua).
]]
--- @include "keys"

-- The license's seat count, 0 when there is no record.
local function seats_total()
  return tonumber(rcall('HGET', K.license, 'seats_total')) or 0
end

-- Reads the license record and decides whether it may hand out seats now.
-- Returns (refusal status or nil, seats_total, whether its `policy` flag is
-- on: its policy fields are then read too, policy.lua).
local function check_license(now)
  local f = rcall('HMGET', K.license, 'seats_total', 'expires_at_ms', 'active', 'policy')
  local total = tonumber(f[1])
  local policy = f[4] == '1'
  if not total then
    return 'LICENSE_NOT_FOUND', 0, policy
  end
  if f[3] == '0' then
    return 'LICENSE_INACTIVE', total, policy
  end
  local expires = tonumber(f[2]) or 0
  if expires > 0 and now >= expires then
    return 'LICENSE_EXPIRED', total, policy
  end
  return nil, total, policy
end
