--[[
  heartbeat: record that `session` is still alive.

  KEYS[1..4] the license record, where its events go and the dedupe
              buckets (includes/keys.lua, includes/request.lua); the queue
              keys are not touched
  ARGV[1..7] the dedupe arguments, the session, its lease, the request's
              deadline and the service's settings (includes/request.lua); the lease must be the one the seat is
              bound to, if any

  Returns an outcome (includes/outcome.lua), no notes, with status
    HEARTBEAT_UPDATED   last heartbeat set to now, count incremented;
                        detail = the heartbeat count. A borrowed seat
                        (includes/owners.lua) keeps its borrow's end as its
                        score: ZADD GT never lowers it
    QUEUED              the session waits in the queue: it showed it is
                        alive (K.alive, keys.lua), and keeps its place a
                        heartbeat timeout more; detail = its 1-based
                        position. Changes nothing else. A place bound to
                        a lease needs that lease (else LEASE_MISMATCH)
    SESSION_NOT_ACTIVE  the session holds no seat (never acquired, released,
                        evicted; a lingering seat was released): acquire
                        again; detail = 'license_deleted' when the license
                        has no record and was deleted within a day (its
                        tombstone, keys.lua: its seats ended with it)
    SESSION_REVOKED     the session holds no seat because an administrator
                        revoked it (remembered for a bounded time);
                        detail = the revocation record (includes/revoked.lua)
    LEASE_MISMATCH      the seat is bound to another lease; nothing changed,
                        and the refusal is not counted in the rate limits
    RATE_LIMITED        too many requests from this session or license
    REQUEST_EXPIRED     read after its deadline (includes/request.lua); nothing changed
  or, for a redelivered entry, the outcome it got the first time (includes/dedupe.lua).
  The outcome carries the license's stale time (includes/due.lua) when this
  heartbeat, the oldest holder's, moved it on; nothing else of the due
  index: a heartbeat neither takes a seat nor makes other work. So it
  includes no due.lua (whose function would cost every heartbeat its
  closure) and reads nothing more than before but the first two holders,
  which also give it the session's own score when it is the oldest.
  HEARTBEAT_UPDATED, replayed or not, carries the heartbeat timeout in force
  (outcome.lua [11]), so a holder learns of a timeout lowered while it holds
  the seat from its next heartbeat's reply.
  Heartbeats work whatever the license record says, even when it breaks its
  rules: a holder keeps its seat alive.
  Records no events but a denial's (RATE_LIMITED, includes/request.lua).
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
--- @include "waiter_record"
--- @include "request"

-- The session record the lease check read, parsed (holder_lease,
-- session_record.lua), for count_heartbeat: `checked` is the session it
-- belongs to, set by every lease check, which run_request runs before
-- decide in the same call, and nothing between the two writes the record.
local checked, checked_at, checked_beats, checked_lease, checked_meta

-- LEASE_MISMATCH when `session`'s seat is bound to another lease than hash
-- `lease`: the `refuse` of run_request (includes/request.lua).
local function holder_lease_refusal(session, lease, now)
  local bound
  bound, checked_at, checked_beats, checked_meta = holder_lease(session)
  checked, checked_lease = session, bound
  return lease_refusal(now, bound, lease)
end

-- Counts one heartbeat (the session record's form: session_record.lua) of `session` at `now`. Returns the new count.
local function count_heartbeat(session, now)
  local acquired_at, beats, lease, meta
  if checked == session then
    acquired_at, beats, lease, meta = checked_at, checked_beats, checked_lease, checked_meta
  else
    local record = rcall('HGET', K.sessions, session)
    if record then
      acquired_at, beats, lease, meta = parse_session_record(record)
    end
  end
  checked = nil
  if not acquired_at then
    -- A missing or foreign record: start a fresh one rather than lose the
    -- count. It is bound to no lease: nothing says which one it had.
    acquired_at, beats, lease, meta = now, 0, '', '{}'
  end
  rcall('HSET', K.sessions, session, encode_session_record(acquired_at, beats + 1, lease, meta))
  return beats + 1
end

-- What follows runs on every call; what precedes is built once, when the
-- function library is loaded (src/engine/scripts/includes.rs).
--- @per_call
local session, lease = ARGV[4], lease_hash(ARGV[5])

-- Set by decide: the license's stale time when this heartbeat, the oldest
-- holder's, moved it on; the heartbeat timeout in force.
local stale_at, timeout

-- The decision (run_request, includes/request.lua).
local function decide(now, default_timeout)
  local raw = rcall('HMGET', K.license, 'seats_total', 'heartbeat_timeout_ms')
  local total = raw[1] and license_number('seats_total', raw[1]) or 0
  timeout = raw[2] and license_number('heartbeat_timeout_ms', raw[2]) or default_timeout
  -- The first two holders: when the session is the oldest, its heartbeat
  -- moves the license's stale time on (and they give its score).
  local first = rcall('ZRANGE', K.holders, '0', '1', 'WITHSCORES')
  local score
  if first[1] == session then
    score = first[2]
  else
    score = rcall('ZSCORE', K.holders, session)
  end
  if not score then
    -- A waiting session shows it is alive (K.alive, keys.lua): it keeps its
    -- place a heartbeat timeout more, and hears where it stands. Only with
    -- the lease it queued with.
    local place = rcall('ZRANK', K.queue, session)
    if place then
      local w = waiter_record(session)
      if w and w.lease_hash ~= '' and w.lease_hash ~= lease then
        return outcome('LEASE_MISMATCH', rcall('ZCARD', K.holders), total, 0, now, {})
      end
      rcall('ZADD', K.alive, ms(now + timeout), session)
      return outcome('QUEUED', rcall('ZCARD', K.holders), total, place + 1, now, {}, 0)
    end
  end
  if not score or score == LINGERING then
    local revoked = revocation_of(session, now)
    if revoked then
      return outcome('SESSION_REVOKED', rcall('ZCARD', K.holders), total, revoked, now, {})
    end
    -- No record, and the license's tombstone: it was deleted (its seats
    -- with it), and the holder hears so, not a bare SESSION_NOT_ACTIVE.
    local deleted = not raw[1] and rcall('EXISTS', K.deleted) == 1
    return outcome('SESSION_NOT_ACTIVE', rcall('ZCARD', K.holders), total, deleted and 'license_deleted' or 0,
      now, {})
  end
  -- The oldest holder's heartbeat moves the stale time on: to the earlier
  -- of its new score (now, or a borrow's later end) and the next oldest's.
  if first[1] == session then
    local oldest = math.max(tonumber(score), now)
    local next_oldest = tonumber(first[4])
    if next_oldest and next_oldest < oldest then
      oldest = next_oldest
    end
    stale_at = oldest + timeout + 1
  end
  rcall('ZADD', K.holders, 'XX', 'GT', ms(now), session)
  local count = count_heartbeat(session, now)
  return outcome('HEARTBEAT_UPDATED', rcall('ZCARD', K.holders), total, count, now, {})
end

local result, _, default_timeout = run_request(decide, true, holder_lease_refusal, session, lease)
-- The due index slots (outcome.lua [9]..[11]); a replay (dedupe.lua) comes
-- with [1..8] only. [10] is set already when a denial (RATE_LIMITED) was
-- the first its window folded (request.lua): the window's end.
result[9], result[10], result[11] = stale_at or 0, result[10] or 0, 0
if result[1] == 'HEARTBEAT_UPDATED' or result[1] == 'QUEUED' then
  -- On a replay, the timeout in force now, which is what the session must meet.
  result[11] = timeout or heartbeat_timeout(default_timeout)
end
return replied(result)
