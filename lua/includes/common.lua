--[[
  Helpers shared by every seat script. The Rust side prepends this file to
  each script at build time (src/scripts.rs), so each script stays one
  self-contained EVALSHA body.

  Session records (HASH `sessions`, one field per session) are stored as
    <acquired_at_ms>:<heartbeat_count>:<meta json>
  which keeps a ~60-byte metadata record small enough for listpack encoding
  and lets heartbeats bump the count without decoding the JSON.
]]
local rcall = redis.call

-- One clock for every worker: the Redis server's, in milliseconds.
local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Reads the license record and decides whether it may hand out seats now.
-- Returns (refusal status or nil, seats_total).
local function check_license(license_key, now)
  local f = rcall('HMGET', license_key, 'seats_total', 'expires_at_ms', 'active')
  local total = tonumber(f[1])
  if not total then
    return 'LICENSE_NOT_FOUND', 0
  end
  if f[3] == '0' then
    return 'LICENSE_INACTIVE', total
  end
  local expires = tonumber(f[2]) or 0
  if expires > 0 and now >= expires then
    return 'LICENSE_EXPIRED', total
  end
  return nil, total
end

-- seats_total for replies that do not depend on the license being usable.
local function seats_total(license_key)
  return tonumber(rcall('HGET', license_key, 'seats_total')) or 0
end
