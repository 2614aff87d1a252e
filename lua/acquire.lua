--[[
  acquire: give `session` a seat of the license, or a place in its queue.

  KEYS[1..14] the license keys, the dedupe buckets, the rate windows and the
              revocation keys (includes/keys.lua)
  ARGV[1..7]  dedupe and rate-limit arguments (includes/prologue.lua)
  ARGV[8]  session id (validated by the worker: [A-Za-z0-9._:@-]{1,128})
  ARGV[9]  lease the seat or place is bound to ('' = none; validated by the
           worker: [A-Za-z0-9_-]{16,128}); stored as a hash (includes/lease.lua)
  ARGV[10] metadata, a JSON object (validated by the worker)
  ARGV[11] wait_ms: 0 = answer at once; > 0 = queue for up to that long
  ARGV[12] request id (echoed in a later GRANTED / QUEUE_TIMEOUT)
  ARGV[13] reply_to of the request ('' = none)
  ARGV[14] queue length limit when the license sets no queue_max
  ARGV[15] heartbeat timeout (ms) when the license sets no heartbeat_timeout_ms

  Returns an outcome (includes/outcome.lua) with status
    ACQUIRED            seat taken, heartbeat clock started
    ALREADY_ACTIVE      the session already holds a seat, bound to this lease
                        or to none; nothing changed
    QUEUED              detail = 1-based queue position; changed = 0 when the
                        session was already waiting (same place, no second event)
    NO_SEATS_AVAILABLE  no free seat, or others wait first (no queue jumping);
                        detail = 'queue_full' when the queue is full
    LEASE_MISMATCH      the session holds a seat or waits, bound to another
                        lease than this one (or this one carries none); nothing changed
    LICENSE_INVALID     the license record breaks its rules (includes/license.lua);
                        detail = {field, value}; nothing changed, not even a
                        retried acquire of a holder is answered ALREADY_ACTIVE
    LICENSE_NOT_FOUND | LICENSE_INACTIVE | LICENSE_EXPIRED
    RATE_LIMITED        too many requests from this session or license
    SESSION_REVOKED     an administrator revoked the session with a cooldown
                        that still lasts; detail = the revocation record
                        (includes/revoked.lua)
  or, for a redelivered entry, the outcome it got the first time (includes/dedupe.lua).
  The outcome carries the license's times for the reaper's due index where
  the call may have moved them, and the heartbeat timeout in force
  (includes/prologue.lua, finish).
  notes: waiters granted or timed out on the way (free seats always go to the
  queue first, which also heals a seat freed without a grant).
  The license check runs inside this script, so a change of seats_total,
  expiry or `active` can never race with an acquire.
  Emits no events: the worker publishes them from the outcome.
]]
local rcall = redis.call
--- @include "keys"
--- @include "clock"
--- @include "license"
--- @include "outcome"
--- @include "session_record"
--- @include "queue"
--- @include "lease"
--- @include "revoked"
--- @include "prologue"

local session, lease = ARGV[8], lease_hash(ARGV[9])
local meta = ARGV[10]
local wait_ms, request_id, reply_to = tonumber(ARGV[11]), ARGV[12], ARGV[13]
local default_queue_max = tonumber(ARGV[14])
local default_timeout = tonumber(ARGV[15])

local now = now_ms()
local early = prologue(now, true, function()
  local bound = holder_lease(session)
  if bound == nil then
    bound = waiter_lease(session)
  end
  return lease_refusal(now, bound, lease)
end)
if early then
  return finish(early, now, default_timeout)
end

local function decide()
  local license = license_state(now)
  if license.refusal == 'LICENSE_INVALID' then
    return outcome('LICENSE_INVALID', rcall('ZCARD', K.holders), license.total, license.invalid, now, {})
  end
  local notes = {}
  expire_waiters(now, notes, 100)

  -- A retried acquire gets the answer the first one got, whatever happened to
  -- the license since: the session holds its seat until it releases or is
  -- reaped. (Its lease was checked in the prologue.)
  if rcall('ZSCORE', K.holders, session) then
    return outcome('ALREADY_ACTIVE', rcall('ZCARD', K.holders), license.total, 0, now, notes)
  end
  local rank = rcall('ZRANK', K.queue, session)
  if rank then
    -- Re-sent while waiting: same place, current position, nothing changed.
    return outcome('QUEUED', rcall('ZCARD', K.holders), license.total, rank + 1, now, notes, 0)
  end
  local revoked = cooldown_of(session, now)
  if revoked then
    return outcome('SESSION_REVOKED', rcall('ZCARD', K.holders), license.total, revoked, now, notes)
  end
  if license.refusal then
    return outcome(license.refusal, rcall('ZCARD', K.holders), license.total, 0, now, notes)
  end

  local total = license.total
  local used = promote(now, total, notes, 100)
  if used < total and rcall('ZCARD', K.queue) == 0 then
    -- A free seat and nobody waiting for it: take it.
    rcall('ZADD', K.holders, now, session)
    start_session(session, now, meta, lease)
    return outcome('ACQUIRED', used + 1, total, 0, now, notes)
  end

  if wait_ms <= 0 then
    return outcome('NO_SEATS_AVAILABLE', used, total, 0, now, notes)
  end
  local queue_max = license.queue_max or default_queue_max
  local depth = rcall('ZCARD', K.queue)
  if depth >= queue_max then
    return outcome('NO_SEATS_AVAILABLE', used, total, 'queue_full', now, notes)
  end
  enqueue(session, now, wait_ms, request_id, reply_to, meta, lease)
  return outcome('QUEUED', used, total, depth + 1, now, notes)
end

return finish(settle(decide()), now, default_timeout)
