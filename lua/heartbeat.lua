--[[
  heartbeat: record that `session` is still alive.

  KEYS     the eleven keys of lua/includes/common.lua; the queue keys are not touched
  ARGV[1..6] dedupe and rate-limit arguments (lua/includes/common.lua)
  ARGV[7]  session id

  Returns {status, seats_used, seats_total, heartbeat_count, now_ms, {}}:
    HEARTBEAT_UPDATED   last heartbeat set to now, count incremented
    SESSION_NOT_ACTIVE  the session holds no seat (never acquired, released,
                        evicted, or still queued): acquire again
    RATE_LIMITED        too many requests from this session or license
  A redelivered entry gets the reply it got the first time (common.lua).
]]
local session = ARGV[7]

local now = now_ms()
local early = prologue(now, true)
if early then
  return early
end

local function decide()
  local total = tonumber(rcall('HGET', K.license, 'seats_total')) or 0
  if not rcall('ZSCORE', K.holders, session) then
    return {'SESSION_NOT_ACTIVE', rcall('ZCARD', K.holders), total, 0, now, {}}
  end
  rcall('ZADD', K.holders, 'XX', now, session)

  local count = 1
  local record = rcall('HGET', K.sessions, session)
  local acquired_at, beats, meta
  if record then
    acquired_at, beats, meta = string.match(record, '^(%d+):(%d+):(.*)$')
  end
  if acquired_at then
    count = tonumber(beats) + 1
  else
    -- A missing or foreign record: start a fresh one rather than lose the count.
    acquired_at, meta = now, '{}'
  end
  rcall('HSET', K.sessions, session, acquired_at .. ':' .. count .. ':' .. meta)
  return {'HEARTBEAT_UPDATED', rcall('ZCARD', K.holders), total, count, now, {}}
end

return remember(ARGV[1], ARGV[2], decide())
