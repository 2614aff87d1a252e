--[[
  release: free the seat that `session` holds, or take it out of the queue.
  Only the session's own id releases it, and only with its lease when the
  seat or place is bound to one; nothing else is touched.

  KEYS[1..4] the license record, where its events go and the dedupe
              buckets (includes/keys.lua, includes/request.lua)
  ARGV[1..7] the dedupe arguments, the session, its lease, the request's
              deadline and the service's settings (includes/request.lua); release is never rate limited, and its
              lease must be the one the seat or place is bound to, if any

  Returns an outcome (includes/outcome.lua) with status (detail 0 unless said)
    RELEASED           the seat is free; it went straight to the head of the
                       queue if anyone waits (notes carry the GRANTED).
                       With the license's linger_ms (includes/policy.lua)
                       the seat lingers instead: it stays with the session
                       that long, and detail = linger_ms (else 0)
    LEFT_QUEUE         the session was waiting; it no longer does
    SESSION_REVOKED    the session neither holds a seat nor waits because an
                       administrator revoked it (remembered for a bounded
                       time); detail = the revocation record (includes/revoked.lua)
    SESSION_NOT_FOUND  the session neither holds a seat nor waits (a
                       lingering seat was released already); detail =
                       'license_deleted' when the license has no record
                       and was deleted within a day (its tombstone,
                       keys.lua: its seats ended with it)
    LEASE_MISMATCH     the seat or place is bound to another lease; nothing changed
    REQUEST_EXPIRED    read after its deadline (includes/request.lua); nothing changed
  or, for a redelivered entry, the outcome it got the first time (includes/dedupe.lua).
  The outcome carries the license's times for the reaper's due index where
  the call may have moved them, and the heartbeat timeout in force
  (includes/due.lua, due_report).
  Release works whatever the license's state, even when its record breaks
  the rules: a user can always give a seat back (its policy fields then do
  not apply: no linger). A freed seat goes to the queue only while the
  license may hand out seats.
  Records its events itself (includes/events.lua, includes/request.lua):
  the outcome's first (released, left_queue), then its notes'.
]]
local rcall = redis.call
--- @include "keys"
--- @include "clock"
--- @include "license"
--- @include "outcome"
--- @include "session_record"
--- @include "queue"
--- @include "owners"
--- @include "policy"
--- @include "lease"
--- @include "seat_lease"
--- @include "revoked"
--- @include "request"
--- @include "grant"
--- @include "due"

local session, lease = ARGV[4], lease_hash(ARGV[5])
-- The release frees the seat its notes grant: its event goes first.
EV.request_first = true

-- Set by decide: the heartbeat timeout in force, as the record says.
local timeout

-- The decision (run_request, includes/request.lua).
local function decide(now, default_timeout)
  local notes = {}
  local license = license_state(now)
  timeout = license.heartbeat_timeout_ms or default_timeout
  local P, invalid = nil, nil
  if license.policy and not license.refusal then
    P, invalid = policy().read(license.record)
  end
  local total = license.total
  local owner = owner_of(session)
  EV.who = owner or false

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
    local used = grant_if_valid(license, now, notes, 100, P, invalid)
    return outcome('RELEASED', used, total, 0, now, notes)
  end
  if rcall('ZSCORE', K.queue, session) then
    remove_waiter(session, owner)
    if owner then
      owners().forget(session)
    end
    return outcome('LEFT_QUEUE', rcall('ZCARD', K.holders), total, 0, now, notes)
  end
  local revoked = revocation_of(session, now)
  if revoked then
    return outcome('SESSION_REVOKED', rcall('ZCARD', K.holders), total, revoked, now, notes)
  end
  -- No record, and the license's tombstone: it was deleted, the seat with it.
  local deleted = license.refusal == 'LICENSE_NOT_FOUND' and rcall('EXISTS', K.deleted) == 1
  return outcome('SESSION_NOT_FOUND', rcall('ZCARD', K.holders), total, deleted and 'license_deleted' or 0, now,
    notes)
end

use_claim(service().heartbeat_timeout, service().claim_ms)
local result, now, default_timeout = run_request(decide, false, seat_lease_refusal, session, lease)
return replied(send_queue_replies(due_report(result, now, default_timeout, timeout)))
