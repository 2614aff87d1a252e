--[[
  heartbeat: record that `session` is still alive.

  KEYS[1..13] the license keys, the dedupe bucket, the rate windows and the
              revocation keys (includes/keys.lua); the queue keys are not touched
  ARGV[1..6]  dedupe and rate-limit arguments (includes/prologue.lua)
  ARGV[7]  session id

  Returns an outcome (includes/outcome.lua), no notes, with status
    HEARTBEAT_UPDATED   last heartbeat set to now, count incremented;
                        detail = the heartbeat count
    SESSION_NOT_ACTIVE  the session holds no seat (never acquired, released,
                        evicted, or still queued): acquire again
    SESSION_REVOKED     the session holds no seat because an administrator
                        revoked it (remembered for a bounded time);
                        detail = the revocation record (includes/revoked.lua)
    RATE_LIMITED        too many requests from this session or license
  or, for a redelivered entry, the outcome it got the first time (includes/dedupe.lua).
  Emits no events.
]]
local rcall = redis.call
--- @include "keys"
--- @include "clock"
--- @include "license"
--- @include "outcome"
--- @include "session_record"
--- @include "revoked"
--- @include "prologue"

local session = ARGV[7]

local now = now_ms()
local early = prologue(now, true)
if early then
  return early
end

local function decide()
  local total = seats_total()
  if not rcall('ZSCORE', K.holders, session) then
    local revoked = revocation_of(session, now)
    if revoked then
      return outcome('SESSION_REVOKED', rcall('ZCARD', K.holders), total, revoked, now, {})
    end
    return outcome('SESSION_NOT_ACTIVE', rcall('ZCARD', K.holders), total, 0, now, {})
  end
  rcall('ZADD', K.holders, 'XX', now, session)
  local count = count_heartbeat(session, now)
  return outcome('HEARTBEAT_UPDATED', rcall('ZCARD', K.holders), total, count, now, {})
end

return settle(decide())
