--[[
  heartbeat: record that `session` is still alive.

  KEYS[1]  seat:{L}:license   HASH
  KEYS[2]  seat:{L}:holders   ZSET  session -> last heartbeat (ms); the reaper
                                     reads stale sessions off its low end
  KEYS[3]  seat:{L}:sessions  HASH  session -> session record

  ARGV[1]  session id

  Returns {status, seats_used, seats_total, heartbeat_count}; status is one of
    HEARTBEAT_UPDATED   last heartbeat set to now, count incremented
    SESSION_NOT_ACTIVE  the session holds no seat (never acquired, released
                        or evicted): the client must acquire again
]]
local license_key, holders_key, sessions_key = KEYS[1], KEYS[2], KEYS[3]
local session = ARGV[1]

local total = seats_total(license_key)
if not rcall('ZSCORE', holders_key, session) then
  return {'SESSION_NOT_ACTIVE', rcall('ZCARD', holders_key), total, 0}
end

local now = now_ms()
rcall('ZADD', holders_key, 'XX', now, session)

local count = 1
local record = rcall('HGET', sessions_key, session)
if record then
  local acquired_at, beats, meta = string.match(record, '^(%d+):(%d+):(.*)$')
  if acquired_at then
    count = tonumber(beats) + 1
    rcall('HSET', sessions_key, session, acquired_at .. ':' .. count .. ':' .. meta)
  end
end
return {'HEARTBEAT_UPDATED', rcall('ZCARD', holders_key), total, count}
