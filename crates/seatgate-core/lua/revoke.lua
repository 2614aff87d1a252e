--[[
  revoke: an administrator takes `session`'s seat away (or its place in the
  queue), whatever the session says: no heartbeat or release of its own is
  needed, and a seat or place bound to a lease (includes/lease.lua) is
  revoked without it: this is the administrator's way around leases. The freed seat goes to the head of the queue in this same
  script, as on release. The revocation is remembered for a bounded time
  (includes/revoked.lua), so the session's next heartbeat or release hears
  SESSION_REVOKED with the reason, and with a cooldown its acquires are
  refused until the cooldown ends.

  KEYS[1..4] the license record, where its events go and the dedupe
              buckets (includes/keys.lua, includes/request.lua; the rate
              windows are never touched: revoke is not rate limited)
  ARGV[1..7] the dedupe arguments, the session, its lease, the request's
              deadline and the service's settings (includes/request.lua); the rate limits are not read, and the
              lease is ignored (the request scripts' slot; a revoke carries
              none)
  ARGV[8]  reason (validated by the worker: 1-512 bytes of text)
  ARGV[9]  actor, who revokes (validated by the worker)
  ARGV[10] cooldown_ms: 0 = the session may acquire again at once; > 0 =
           its acquires get SESSION_REVOKED for that long
  ARGV[11] remember_ms: how long a revocation is remembered at least
  ARGV[12] most revocations remembered per license
  ARGV[13] '1': the cooldown binds the session's user too (cooldown_scope=user):
           the user's acquires, whatever their session id, get
           SESSION_REVOKED for cooldown_ms (includes/revoked.lua). The user is
           the revoked session's owner record's (includes/owners.lua); a
           session without one binds only itself. '0': the session alone

  Returns an outcome (includes/outcome.lua) with status
    REVOKED            detail 1: the session held a seat, now free (it went
                       straight to the head of the queue if anyone waits:
                       notes carry the GRANTED); detail 0: it waited and no
                       longer does (a note SESSION_REVOKED tells it, on the
                       reply stream it queued with)
    SESSION_NOT_FOUND  detail 0: the session neither holds a seat nor waits;
                       nothing changed, nothing is remembered
    REQUEST_EXPIRED    read after its deadline (includes/request.lua); nothing changed
  or, for a redelivered entry, the outcome it got the first time (includes/dedupe.lua).
  The outcome carries the license's times for the reaper's due index where
  the call may have moved them (includes/due.lua, due_report).
  Revoke works whatever the license's state, even when its record breaks the
  rules, like release; the freed seat goes to the queue only while the
  license may hand out seats (under its policies, includes/policy.lua). A
  lingering or borrowed seat is revoked like any other, at once, and the
  seat's user and group counts drop with it (includes/owners.lua).
  Records its events itself (includes/events.lua, includes/request.lua):
  `revoked` (with actor, reason, held and the session's user and group)
  first, then its notes'.
]]
local rcall = redis.call
--- @include "keys"
--- @include "clock"
--- @include "license"
--- @include "outcome"
--- @include "outbox"
--- @include "session_record"
--- @include "queue"
--- @include "owners"
--- @include "policy"
--- @include "revoked"
--- @include "request"
--- @include "grant"
--- @include "due"

-- Remembers that `session` was revoked at `now`, and keeps the memory bounded
-- (see the header of includes/revoked.lua; only revoke writes an entry).
local function remember_revocation(session, now, reason, actor, cooldown_ms, remember_ms, max)
  local stale = rcall('ZRANGEBYSCORE', K.revoked, '-inf', now, 'LIMIT', 0, 100)
  for _, s in ipairs(stale) do
    forget_revocation(s)
  end
  local over = rcall('ZCARD', K.revoked) - max + 1
  if over > 0 then
    for _, s in ipairs(rcall('ZRANGE', K.revoked, 0, math.min(over, 100) - 1)) do
      forget_revocation(s)
    end
  end
  local cooldown_until = 0
  if cooldown_ms > 0 then
    cooldown_until = now + cooldown_ms
  end
  rcall('ZADD', K.revoked, now + math.max(remember_ms, cooldown_ms), session)
  rcall('HSET', K.revocations, session, cjson.encode({
    reason = reason, actor = actor, at = now, cooldown_until = cooldown_until,
  }))
  local last = rcall('ZRANGE', K.revoked, -1, -1, 'WITHSCORES')
  rcall('PEXPIREAT', K.revoked, last[2])
  rcall('PEXPIREAT', K.revocations, last[2])
end

-- What follows runs on every call; what precedes is built once, when the
-- function library is loaded (src/engine/scripts/includes.rs).
--- @per_call
local session, reason, actor = ARGV[4], ARGV[8], ARGV[9]
local cooldown_ms, remember_ms, max = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local user_wide = ARGV[13] == '1'
-- The revocation frees the seat its notes grant: its event goes first.
EV.request_first, EV.extra = true, {'reason', reason, 'actor', actor}

-- With a user-wide cooldown, remembers it for the user of `owner` (the
-- revoked session's owner record) as well.
local function remember_user(owner, now)
  if user_wide and cooldown_ms > 0 and owner and owner.user ~= '' then
    remember_revocation(USER_REVOCATION .. owner.user, now, reason, actor, cooldown_ms, remember_ms, max)
  end
end

-- Set by decide: the heartbeat timeout in force, as the record says.
local timeout

-- The decision (run_request, includes/request.lua).
local function decide(now, default_timeout)
  local notes = {}
  local license = license_state(now)
  timeout = license.heartbeat_timeout_ms or default_timeout
  local total = license.total
  local owner = owner_of(session)
  EV.who = owner or false

  if rcall('ZREM', K.holders, session) == 1 then
    rcall('HDEL', K.sessions, session)
    if owner then
      owners().gone(session, owner)
    end
    remember_revocation(session, now, reason, actor, cooldown_ms, remember_ms, max)
    remember_user(owner, now)
    expire_waiters(now, notes, 100)
    local used = grant_if_valid(license, now, notes, 100)
    return outcome('REVOKED', used, total, 1, now, notes)
  end
  local w = waiter_record(session)
  if rcall('ZSCORE', K.queue, session) then
    remove_waiter(session, owner)
    if owner then
      owners().forget(session)
    end
    remember_revocation(session, now, reason, actor, cooldown_ms, remember_ms, max)
    remember_user(owner, now)
    if w then
      -- Its acquire waits for a final answer: this is it.
      note(notes, now, 'SESSION_REVOKED', session, w)
    end
    return outcome('REVOKED', rcall('ZCARD', K.holders), total, 0, now, notes)
  end
  return outcome('SESSION_NOT_FOUND', rcall('ZCARD', K.holders), total, 0, now, notes)
end

use_claim(service().heartbeat_timeout, service().claim_ms)
local result, now, default_timeout = run_request(decide, false, nil, session, nil)
return replied(send_queue_replies(due_report(result, now, default_timeout, timeout)))
