--[[
  heartbeat: record that `session` is still alive.

  KEYS[1..17] the license keys, the dedupe buckets, the rate windows and the
              revocation keys (includes/keys.lua); the queue keys are not touched
  ARGV[1..7]  dedupe and rate-limit arguments (includes/prologue.lua)
  ARGV[8]  session id
  ARGV[9]  lease ('' = none): must be the one the seat is bound to, if any

  Returns an outcome (includes/outcome.lua), no notes, with status
    HEARTBEAT_UPDATED   last heartbeat set to now, count incremented;
                        detail = the heartbeat count. A borrowed seat
                        (includes/owners.lua) keeps its borrow's end as its
                        score: ZADD GT never lowers it
    SESSION_NOT_ACTIVE  the session holds no seat (never acquired, released,
                        evicted, or still queued; a lingering seat was
                        released): acquire again
    SESSION_REVOKED     the session holds no seat because an administrator
                        revoked it (remembered for a bounded time);
                        detail = the revocation record (includes/revoked.lua)
    LEASE_MISMATCH      the seat is bound to another lease; nothing changed,
                        and the refusal is not counted in the rate limits
    RATE_LIMITED        too many requests from this session or license
  or, for a redelivered entry, the outcome it got the first time (includes/dedupe.lua).
  Heartbeats work whatever the license record says, even when it breaks its
  rules: a holder keeps its seat alive.
  Emits no events.
]]
local rcall = redis.call
--- @include "keys"
--- @include "clock"
--- @include "license"
--- @include "outcome"
--- @include "session_record"
--- @include "owners"
--- @include "lease"
--- @include "revoked"
--- @include "prologue"

local session, lease = ARGV[8], lease_hash(ARGV[9])

local now = now_ms()
local early = prologue(now, true, function()
  return lease_refusal(now, holder_lease(session), lease)
end)
if early then
  return early
end

local function decide()
  local total = seats_total()
  local score = rcall('ZSCORE', K.holders, session)
  if not score or score == LINGERING then
    local revoked = revocation_of(session, now)
    if revoked then
      return outcome('SESSION_REVOKED', rcall('ZCARD', K.holders), total, revoked, now, {})
    end
    return outcome('SESSION_NOT_ACTIVE', rcall('ZCARD', K.holders), total, 0, now, {})
  end
  rcall('ZADD', K.holders, 'XX', 'GT', ms(now), session)
  local count = count_heartbeat(session, now)
  return outcome('HEARTBEAT_UPDATED', rcall('ZCARD', K.holders), total, count, now, {})
end

return settle(decide())
