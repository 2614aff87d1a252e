--[[
  release: free the seat that `session` holds, or take it out of the queue.
  Only the session's own id releases it; nothing else is touched.

  KEYS[1..13] the license keys, the dedupe bucket, the rate windows and the
              revocation keys (includes/keys.lua)
  ARGV[1..6]  dedupe and rate-limit arguments (includes/prologue.lua); release
              is never rate limited
  ARGV[7]  session id

  Returns an outcome (includes/outcome.lua) with status (detail 0 unless said)
    RELEASED           the seat is free; it went straight to the head of the
                       queue if anyone waits (notes carry the GRANTED)
    LEFT_QUEUE         the session was waiting; it no longer does
    SESSION_REVOKED    the session neither holds a seat nor waits because an
                       administrator revoked it (remembered for a bounded
                       time); detail = the revocation record (includes/revoked.lua)
    SESSION_NOT_FOUND  the session neither holds a seat nor waits
  or, for a redelivered entry, the outcome it got the first time (includes/dedupe.lua).
  Release works whatever the license's state: a user can always give a seat back.
  Emits no events: the worker publishes them from the outcome.
]]
local rcall = redis.call
--- @include "keys"
--- @include "clock"
--- @include "license"
--- @include "outcome"
--- @include "queue"
--- @include "revoked"
--- @include "prologue"

local session = ARGV[7]

local now = now_ms()
local early = prologue(now, false)
if early then
  return early
end

local function decide()
  local notes = {}
  local refusal, total = check_license(now)

  if rcall('ZREM', K.holders, session) == 1 then
    rcall('HDEL', K.sessions, session)
    expire_waiters(now, notes, 100)
    local used = rcall('ZCARD', K.holders)
    if not refusal then
      used = promote(now, total, notes, 100)
    end
    return outcome('RELEASED', used, total, 0, now, notes)
  end
  if rcall('ZSCORE', K.queue, session) then
    remove_waiter(session)
    return outcome('LEFT_QUEUE', rcall('ZCARD', K.holders), total, 0, now, notes)
  end
  local revoked = revocation_of(session, now)
  if revoked then
    return outcome('SESSION_REVOKED', rcall('ZCARD', K.holders), total, revoked, now, notes)
  end
  return outcome('SESSION_NOT_FOUND', rcall('ZCARD', K.holders), total, 0, now, notes)
end

return settle(decide())
