--[[
  release: free the seat that `session` holds, or take it out of the queue.
  Only the session's own id releases it; nothing else is touched.

  KEYS     the eleven keys of lua/includes/common.lua
  ARGV[1..6] dedupe and rate-limit arguments (release is never rate limited)
  ARGV[7]  session id

  Returns {status, seats_used, seats_total, 0, now_ms, notes}:
    RELEASED           the seat is free; it went straight to the head of the
                       queue if anyone waits (notes carry the GRANTED)
    LEFT_QUEUE         the session was waiting; it no longer does
    SESSION_NOT_FOUND  the session neither holds a seat nor waits
  Release works whatever the license's state: a user can always give a seat back.
  A redelivered entry gets the reply it got the first time (common.lua).
]]
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
    return {'RELEASED', used, total, 0, now, notes}
  end
  if rcall('ZSCORE', K.queue, session) then
    remove_waiter(session)
    return {'LEFT_QUEUE', rcall('ZCARD', K.holders), total, 0, now, notes}
  end
  return {'SESSION_NOT_FOUND', rcall('ZCARD', K.holders), total, 0, now, notes}
end

return remember(ARGV[1], ARGV[2], decide())
