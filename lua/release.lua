--[[
  release: free the seat that `session` holds, or take it out of the queue.
  Only the session's own id releases it; nothing else is touched.

  KEYS[1..14] the license keys, the dedupe bucket and the rate windows (includes/keys.lua)
  ARGV[1..6]  dedupe and rate-limit arguments (includes/prologue.lua); release
              is never rate limited
  ARGV[7]  session id

  Returns an outcome (includes/outcome.lua) with status
    RELEASED           the seat is free; it went straight to the head of the
                       queue if anyone waits (notes carry the GRANTED).
                       With the license's linger_ms (includes/policy.lua)
                       the seat lingers instead: it stays with the session
                       that long, and detail = linger_ms (else 0)
    LEFT_QUEUE         the session was waiting; it no longer does
    SESSION_NOT_FOUND  the session neither holds a seat nor waits (a
                       lingering seat was released already)
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
--- @include "owners"
--- @include "policy"
--- @include "prologue"

local session = ARGV[7]

local now = now_ms()
local early = prologue(now, false)
if early then
  return early
end

local function decide()
  local notes = {}
  local refusal, total, policy_on = check_license(now)
  local owner = owner_of(session)
  local P = policy_on and policy().read() or nil

  if P and (P.linger_ms or 0) > 0 then
    local score = rcall('ZSCORE', K.holders, session)
    if score and score ~= LINGERING then
      -- Released, yet the seat stays the session's for linger_ms.
      owners().linger(session, now, P.linger_ms, owner)
      expire_waiters(now, notes, 100)
      return outcome('RELEASED', rcall('ZCARD', K.holders), total, P.linger_ms, now, notes)
    end
  end
  if owner and rcall('ZSCORE', K.lingering, session) then
    -- Released before: the seat lingers until the reaper frees it.
    return outcome('SESSION_NOT_FOUND', rcall('ZCARD', K.holders), total, 0, now, notes)
  end
  if rcall('ZREM', K.holders, session) == 1 then
    rcall('HDEL', K.sessions, session)
    if owner then
      owners().gone(session, owner)
    end
    expire_waiters(now, notes, 100)
    local used = rcall('ZCARD', K.holders)
    if not refusal then
      used = grant_waiters(now, total, notes, 100, P)
    end
    return outcome('RELEASED', used, total, 0, now, notes)
  end
  if rcall('ZSCORE', K.queue, session) then
    remove_waiter(session)
    if owner then
      owners().forget(session)
    end
    return outcome('LEFT_QUEUE', rcall('ZCARD', K.holders), total, 0, now, notes)
  end
  return outcome('SESSION_NOT_FOUND', rcall('ZCARD', K.holders), total, 0, now, notes)
end

return settle(decide())
