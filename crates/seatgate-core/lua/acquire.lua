--[[
  acquire: give `session` a seat of the license, or a place in its queue.

  KEYS[1..4] the license record, where its events go and the dedupe
              buckets (includes/keys.lua, includes/request.lua); the
              license's other keys derived, its group map K.groups among
              them (includes/policy.lua)
  ARGV[1..7] the dedupe arguments, the session, its lease, the request's
              deadline and the service's settings
              (includes/request.lua); the seat or place is bound to the
              lease, stored as a hash (includes/lease.lua)
  ARGV[8]  metadata, a JSON object (validated by the worker)
  ARGV[9]  wait_ms: 0 = answer at once; > 0 = queue for up to that long
  ARGV[10] request id (echoed in a later GRANTED / QUEUE_TIMEOUT)
  ARGV[11] reply_to of the request ('' = none)
  ARGV[12] queue length limit when the license sets no queue_max
  ARGV[13] who asks, for the license's policies (includes/policy.lua): ''
           for nobody in particular, else "<user>|<group>|<priority>|<borrow_ms>"
             user, group  the ids the seat counts for ('' = none; validated
                          like session ids, so never containing '|')
             priority     place in the queue, 0-9 (capped by max_priority)
             borrow_ms    0 = a seat kept by heartbeats; > 0 = held that long
                          without them (at most the license's max_borrow_ms)
           One argument rather than four: the common acquire, asked by
           nobody in particular, then costs Redis nothing more.

  Returns an outcome (includes/outcome.lua) with status
    ACQUIRED            seat taken, heartbeat clock started; detail = the
                        borrow's end (ms) for a borrowed seat, else 0. Also
                        the answer of a session taking back its own
                        lingering seat (includes/policy.lua)
    ALREADY_ACTIVE      the session already holds a seat, bound to this lease
                        or to none; nothing changed
    QUEUED              detail = 1-based queue position, or {position,
                        priority} for a priority above 0; changed = 0 when
                        the session was already waiting (same place, no
                        second event; its later GRANTED / QUEUE_TIMEOUT now
                        goes to this request's id and reply_to, when it
                        names one)
    NO_SEATS_AVAILABLE  no free seat, or others wait first (no queue jumping);
                        detail = 'queue_full' when the queue is full,
                        'queue_user_full' when the user already has the
                        license's queue_max_per_user sessions waiting
                        (owners.lua, w:<user>), 'queue_group_full' when the
                        group already has queue_max_per_group waiting
                        (wg:<group>), 'reserved' when the free seats are
                        reserved for other groups
    LIMIT_REACHED       detail = the limit: 'max_per_user' or 'group_max'
                        (without wait_ms; with it, the session queues and is
                        granted once under its limits), 'max_borrow_ms'
                        (a borrow the license does not allow), 'require_user'
                        (the license's require_user, and no user), or
                        'group_map' (the license maps users to groups, and
                        the group claimed is not the user's there, or the
                        user's mapped group is no id); nothing changed
    LEASE_MISMATCH      the session holds a seat or waits, bound to another
                        lease than this one (or this one carries none); nothing changed
    LICENSE_INVALID     the license record breaks its rules (includes/license.lua,
                        the policy fields' too, whatever its `policy` says);
                        detail = {field, value}; nothing changed, not even a
                        retried acquire of a holder is answered ALREADY_ACTIVE
    LICENSE_NOT_FOUND | LICENSE_INACTIVE | LICENSE_EXPIRED
    RATE_LIMITED        too many requests from this session or license
    SESSION_REVOKED     an administrator revoked the session (or, user-wide,
                        a session of this user) with a cooldown that still
                        lasts; detail = the revocation record
                        (includes/revoked.lua)
    REQUEST_EXPIRED     read after its deadline (includes/request.lua); nothing changed
  or, for a redelivered entry, the outcome it got the first time (includes/dedupe.lua).
  The outcome carries the license's times for the reaper's due index where
  the call may have moved them, the heartbeat timeout in force and, on
  ACQUIRED and ALREADY_ACTIVE (replays too), held_since_ms: when the seat's
  heartbeat clock last started (includes/due.lua, due_report).
  notes: waiters granted or timed out on the way (free seats always go to the
  queue first, which also heals a seat freed without a grant).
  The license check runs inside this script, so a change of seats_total,
  expiry or `active` can never race with an acquire.
  Records its events itself (includes/events.lua, includes/request.lua):
  the notes' first, then the outcome's (acquired, queued, or denied with
  the status as reason), each with the asker's user and group.
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
--- @include "due"

-- Only acquire queues a session, redirects a waiter and refuses one in its
-- cooldown, so these queue.lua and revoked.lua helpers live here (run on its
-- own, a script builds a closure for each helper it carries on every run;
-- in the function library these are built once, above the per-call line).

-- Puts `session` of `group` and `user` ('' = none) in the queue, behind
-- those of its priority (0-9), until `now + wait_ms`, bound to lease hash
-- `lease` ('' = none), and in the waiters by group and by user (queue.lua);
-- it must show it is alive within heartbeat timeout `timeout` (K.alive).
local function enqueue(session, now, wait_ms, request_id, reply_to, meta, lease, priority, group, user, timeout)
  queue_joined()
  local arrival = rcall('INCR', K.queue_seq)
  -- Scores as strings (clock.lua, ms): exact, as both are whole numbers.
  local score = arrival - priority * PRIORITY_STEP
  rcall('ZADD', K.queue, ms(score), session)
  rcall('ZADD', K.queue_by_group, 0, by_group_member(group, score, session))
  rcall('ZADD', K.queue_by_user, 0, by_user_member(group, user, score, session))
  rcall('ZADD', K.deadlines, ms(now + wait_ms), session)
  rcall('ZADD', K.alive, ms(now + timeout), session)
  rcall('HSET', K.waiters, session, encode_waiter_record(now, lease, request_id, reply_to, meta))
  -- Past 128 waiters the queue is a skiplist (zset-max-listpack-entries),
  -- while the waiters hash stays a listpack up to 512, searched entry by
  -- entry on every wait, grant and timeout: every 128th arrival makes it a
  -- hashtable then too (encoding.lua). A queue of at most 128 stays compact,
  -- as the waiter's memory wants (docs/performance.md).
  if arrival % 128 == 0 and rcall('ZCARD', K.queue) > 128 and is_listpack(K.waiters) then
    hash_as_hashtable(K.waiters)
  end
end

-- Sends the later GRANTED / QUEUE_TIMEOUT of waiting `session` to request
-- `request_id` on `reply_to` instead: a waiter that re-sends its acquire
-- (say from a new process, listening on a new reply stream) hears the answer
-- there. A re-send naming no reply_to changes nothing: the answer still goes
-- where someone may listen. Only call it once the request's lease matched
-- the place's (lease.lua).
local function redirect_waiter(session, request_id, reply_to)
  if reply_to == '' then
    return
  end
  local w = waiter_record(session)
  if w and (w.id ~= request_id or w.reply_to ~= reply_to) then
    -- A record of the JSON form is rewritten in the plain one.
    rcall('HSET', K.waiters, session, encode_waiter_record(w.queued_at, w.lease_hash, request_id, reply_to, w.meta))
  end
end

-- For an acquire by `session`: its revocation record while its cooldown
-- lasts (refuse the acquire), else nil. An acquire past the cooldown (or
-- without one) starts afresh: the revocation is forgotten.
local function cooldown_of(session, now)
  local raw = rcall('HGET', K.revocations, session)
  if not raw then
    return nil
  end
  local ok, r = pcall(cjson.decode, raw)
  if ok and type(r) == 'table' and (tonumber(r.cooldown_until) or 0) > now then
    return raw
  end
  forget_revocation(session)
  return nil
end

-- What follows runs on every call; what precedes is built once, when the
-- function library is loaded (src/engine/scripts/includes.rs).
--- @per_call
local session, lease = ARGV[4], lease_hash(ARGV[5])
local meta = ARGV[8]
local wait_ms, request_id, reply_to = tonumber(ARGV[9]), ARGV[10], ARGV[11]
local default_queue_max = tonumber(ARGV[12])
-- Who asks: nil for nobody in particular.
local asker = nil
if ARGV[13] ~= '' then
  local user, group, priority, borrow_ms = string.match(ARGV[13], '^([^|]*)|([^|]*)|(%d)|(%d+)$')
  asker = {user = user or '', group = group or '', priority = tonumber(priority) or 0, borrow_ms = tonumber(borrow_ms) or 0}
end
-- The events' user and group (events.lua); the group the map gives, once read.
EV.who = asker or false

-- Set by decide: the heartbeat timeout in force, as the record says.
local timeout

-- The decision (run_request, includes/request.lua).
local function decide(now, default_timeout, seated)
  local license = license_state(now)
  timeout = license.heartbeat_timeout_ms or default_timeout
  local P, invalid = nil, license.invalid
  if license.policy and not license.refusal then
    P, invalid = policy().read(license.record)
  end
  if invalid then
    return outcome('LICENSE_INVALID', rcall('ZCARD', K.holders), license.total, invalid, now, {})
  end
  local notes = {}
  expire_waiters(now, notes, 100)

  -- A retried acquire gets the answer the first one got, whatever happened to
  -- the license since: the session holds its seat until it releases or is
  -- reaped. (Its lease was checked in run_request, which read its session
  -- record: without one it holds no seat, and a new session's acquire, the
  -- common one, does not look for it in holders.)
  local score = seated ~= false and rcall('ZSCORE', K.holders, session)
  if score then
    if score == LINGERING then
      -- Released, its seat still lingers with it: taken back at once.
      owners().reclaim(session, now)
      start_session(session, now, meta, lease)
      return outcome('ACQUIRED', rcall('ZCARD', K.holders), license.total, 0, now, notes)
    end
    return outcome('ALREADY_ACTIVE', rcall('ZCARD', K.holders), license.total, 0, now, notes)
  end
  local rank = not nobody_waits() and rcall('ZRANK', K.queue, session)
  if rank then
    -- Re-sent while waiting: same place, current position, no second
    -- event; the later answer goes to this request (its lease was checked
    -- in run_request).
    redirect_waiter(session, request_id, reply_to)
    -- A sign of life, like a waiter heartbeat (queue.lua, K.alive).
    rcall('ZADD', K.alive, 'XX', ms(now + timeout), session)
    local M = policy()
    local priority = M.score_priority(rcall('ZSCORE', K.queue, session))
    return outcome('QUEUED', rcall('ZCARD', K.holders), license.total, M.queued_detail(rank + 1, priority), now, notes, 0)
  end
  local user = asker and asker.user or ''
  -- The session's application (includes/owners.lua), nil on the shared stream.
  local app = app_of(session)
  local revoked = cooldown_of(session, now) or (user ~= '' and cooldown_of(USER_REVOCATION .. user, now))
  if revoked then
    return outcome('SESSION_REVOKED', rcall('ZCARD', K.holders), license.total, revoked, now, notes)
  end
  if license.refusal then
    return outcome(license.refusal, rcall('ZCARD', K.holders), license.total, 0, now, notes)
  end
  -- The applications the license lets use it (includes/policy.lua); a
  -- session of the shared stream is no application's.
  if P and P.applications and not P.applications[app or ''] then
    return outcome('LIMIT_REACHED', rcall('ZCARD', K.holders), license.total, 'application', now, notes)
  end
  -- Identity the server decides (includes/policy.lua).
  if user == '' and P and P.require_user == 1 then
    return outcome('LIMIT_REACHED', rcall('ZCARD', K.holders), license.total, 'require_user', now, notes)
  end
  if asker and (user ~= '' or asker.group ~= '') then
    -- The group map, when the license has one: one HGET for a mapped user,
    -- an EXISTS more otherwise; nothing for an acquire by nobody in particular.
    local mapped = user ~= '' and rcall('HGET', K.groups, user)
    if mapped or rcall('EXISTS', K.groups) == 1 then
      mapped = mapped or ''
      -- A mapped group that is no id (say holding '|', the owner record's
      -- separator) is refused like a disagreeing claim: never a seat counted
      -- for no group, which would escape group_max.
      local id = mapped == '' or owner_id(mapped)
      if not id or (asker.group ~= '' and asker.group ~= mapped) then
        return outcome('LIMIT_REACHED', rcall('ZCARD', K.holders), license.total, 'group_map', now, notes)
      end
      asker.group = mapped
    end
  end

  local total = license.total
  local borrow_ms = asker and asker.borrow_ms or 0
  -- What the session's application may use of the license (request.lua,
  -- service()): seats held and sessions waiting together at most
  -- app_sessions, so that its grants never take it past; at most
  -- app_waiters waiting.
  local S = service()
  local app_held, app_waiting = 0, 0
  if app and (S.app_sessions > 0 or (S.app_waiters > 0 and wait_ms > 0)) then
    local c = rcall('HMGET', K.owners, 'a:' .. app, 'wa:' .. app)
    app_held, app_waiting = tonumber(c[1]) or 0, tonumber(c[2]) or 0
    if S.app_sessions > 0 and app_held + app_waiting >= S.app_sessions then
      return outcome('LIMIT_REACHED', rcall('ZCARD', K.holders), total, 'application_sessions', now, notes)
    end
  end
  if borrow_ms > 0 and not (P and P.max_borrow_ms and borrow_ms <= P.max_borrow_ms) then
    return outcome('LIMIT_REACHED', rcall('ZCARD', K.holders), total, 'max_borrow_ms', now, notes)
  end
  local used, _, clear = grant_waiters(now, total, notes, 100, P)
  local why = nil
  if P and P.limits then
    local M, who = policy(), asker or {user = '', group = ''}
    M.prefetch(P, who)
    why = M.seat_refusal(P, who, used, total)
  elseif used >= total then
    why = 'full'
  end
  -- Whether the seat (or place) has an owner record (includes/owners.lua),
  -- and the owner it records.
  local owned = app or (asker and (asker.user ~= '' or asker.group ~= '' or borrow_ms > 0))
  local owner = owned and {user = asker and asker.user or '', group = asker and asker.group or '',
    borrow_ms = borrow_ms, app = app}
  if not why and clear then
    -- A free seat that nobody waiting could take: take it.
    hold(session, now, meta, lease, used + 1)
    local borrowed_until = 0
    if owned then
      local O = owners()
      rcall('HSET', K.owners, 's:' .. session, O.record(owner.user, owner.group, borrow_ms, session))
      borrowed_until = O.taken(session, now, owner)
    end
    return outcome('ACQUIRED', used + 1, total, borrowed_until, now, notes)
  end

  if wait_ms <= 0 then
    if why == 'max_per_user' or why == 'group_max' then
      return outcome('LIMIT_REACHED', used, total, why, now, notes)
    end
    return outcome('NO_SEATS_AVAILABLE', used, total, why == 'reserved' and 'reserved' or 0, now, notes)
  end
  local queue_max = license.queue_max or default_queue_max
  local depth = rcall('ZCARD', K.queue)
  if depth >= queue_max then
    return outcome('NO_SEATS_AVAILABLE', used, total, 'queue_full', now, notes)
  end
  if user ~= '' and P and P.queue_max_per_user
      and (tonumber(rcall('HGET', K.owners, 'w:' .. user)) or 0) >= P.queue_max_per_user then
    return outcome('NO_SEATS_AVAILABLE', used, total, 'queue_user_full', now, notes)
  end
  if app and S.app_waiters > 0 and app_waiting >= S.app_waiters then
    return outcome('NO_SEATS_AVAILABLE', used, total, 'queue_application_full', now, notes)
  end
  local group = asker and asker.group or ''
  if group ~= '' and P and P.queue_max_per_group
      and (tonumber(rcall('HGET', K.owners, 'wg:' .. group)) or 0) >= P.queue_max_per_group then
    return outcome('NO_SEATS_AVAILABLE', used, total, 'queue_group_full', now, notes)
  end
  local priority = math.min(asker and asker.priority or 0, P and P.max_priority or 0)
  enqueue(session, now, wait_ms, request_id, reply_to, meta, lease, priority, group, user, timeout)
  if owned then
    rcall('HSET', K.owners, 's:' .. session, owners().record(owner.user, owner.group, borrow_ms, session))
  end
  if user ~= '' then
    rcall('HINCRBY', K.owners, 'w:' .. user, 1)
  end
  if app then
    rcall('HINCRBY', K.owners, 'wa:' .. app, 1)
  end
  if group ~= '' then
    rcall('HINCRBY', K.owners, 'wg:' .. group, 1)
  end
  if priority > 0 then
    local position = rcall('ZRANK', K.queue, session) + 1
    return outcome('QUEUED', used, total, policy().queued_detail(position, priority), now, notes)
  end
  return outcome('QUEUED', used, total, depth + 1, now, notes)
end

use_claim(service().heartbeat_timeout, service().claim_ms)
local result, now, default_timeout = run_request(decide, true, seat_lease_refusal, session, lease)
result = due_report(result, now, default_timeout, timeout, nil, session)
if result[1] == 'QUEUED' then
  -- What the waiter must show it is alive within (K.alive, keys.lua); on a
  -- replay, the timeout in force now.
  result[11] = timeout or heartbeat_timeout(default_timeout)
end
return replied(send_queue_replies(result))
