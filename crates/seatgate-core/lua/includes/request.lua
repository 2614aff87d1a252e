--[[
  request: the skeleton of acquire, release, heartbeat and revoke, the one
  place their run is laid out: the clock, the redelivery lookup, the lease
  check, the rate limits, then the script's own decision, and its outcome
  remembered for the entry.

  They take KEYS[1..4] (keys.lua: the license record, where its events
  go, the dedupe bucket and the one before) and share their first seven ARGV:
    ARGV[1]  what the request's dedupe record is keyed by ('' = no dedupe):
             its stream entry ('<id>', '<shard>:<id>' or 'admin:<id>'), or,
             when the caller sent an id, '<op>|<session>|<id>' (ARGV[3] '2')
    ARGV[2]  unix ms at which KEYS[3] may expire (two windows after its
             bucket starts; dedupe.lua caps it at now + 2 dedupe windows)
    ARGV[3]  '1' to look for the reply the entry got before (the worker always
             asks: even a first delivery may have been decided by a worker that
             stalled past claim_idle_ms and had its batch claimed); '2' the
             same for a key made of the caller's request id, which the
             session's lease hash then prefixes (dedupe.lua); '0' skips it
    ARGV[4]  session id (validated by the worker: [A-Za-z0-9._:@-]{1,128})
    ARGV[5]  lease ('' = none; validated by the worker:
             [A-Za-z0-9_-]{16,128}); revoke sends none and checks none
    ARGV[6]  the request's deadline, unix ms on the Redis clock (0 = none):
             its stream entry's time plus its ttl_ms. A request run after it
             is answered REQUEST_EXPIRED and changes nothing.
    ARGV[7]  the service's settings, one argument (service(), below):
             '<session limit>|<license limit>|<rate window>|<dedupe window>|
              <heartbeat timeout>|<events retention>|<denial window>|
              <denials per window>|<app requests>|<app sessions>|
              <app waiters>|<claim window>', all whole numbers:
               session limit, license limit  most requests per session and
                        per license per rate window (0 = no limit)
               rate window, dedupe window  ms
               heartbeat timeout  the service's (ms), in force where the
                        license sets no heartbeat_timeout_ms: what due_report
                        (due.lua) fills the outcome's last slots with
               events retention  ms (events.lua)
               denial window  ms; denials per window  recorded one by one,
                        0 = all (denial_sample.lua)
             then '|<app requests>|<app sessions>|<app waiters>': what one
               application may use of the license (0 = no limit), applied
               to a session that is an application's, '<app>/<session>'
               (owners.lua, app_of): requests per rate window
               (rate_limit.lua), seats held and sessions waiting
               (acquire.lua; counted as a:<app> and wa:<app>)
             then '|<claim window>': queue.claim_ms, the ms a session granted
               a seat from the queue has to claim it with a heartbeat
               (queue.lua, claim_score; 0 = none)
             and, on one Redis node only, '|<reply ttl>|<reply expiry>|<prefix>':
               the scripts then write the queue replies of their notes
               themselves (outbox.lua, reply_conf_of and send_queue_replies):
               reply ttl and expiry ms, prefix replies.prefix (the rest of
               the argument)
  Their own arguments start at ARGV[8]. The license id the events carry is
  derived from KEYS[1] (keys.lua, license_id).

  Events: the outcome's own (events.lua, EVENT_OF: a change or a denial,
  changed = 1) and its notes' are recorded here, in the script, exactly
  once; a replay and an expired request record none.
  A denial past the window's first `denials per window` is folded into the window's
  count (denial_sample.lua): it records no event and takes no seq; the
  next denial recorded carries the count in `folded`, and on the window's
  first fold the outcome's due time ([10]) is the window's end, so that
  the reaper visits the license then and flushes the count (reap.lua).

  Expiry is checked here, on this script's clock, after the replay: an
  entry decided in time and delivered again later gets its decision again,
  never a second one nor REQUEST_EXPIRED. An expired request takes no seat,
  place or rate-limit hit and publishes nothing (changed = 0); its answer is
  remembered like any other, so whatever arrives again under its key (a
  redelivery, the same request id re-sent) hears REQUEST_EXPIRED too: it
  replays no decision, there being none.

  A script is then its arguments, its decide(now, default_timeout) and
    return due_report(run_request(decide, limited, refuse, session, lease))
  (due.lua; heartbeat fills in the due slots itself).
  Cost: a Lua function costs its closure on every run of a script, so the
  skeleton is one function, handed the script's `decide` and `refuse` as
  they are (no function made for the call).
]]
--- @include "keys"
--- @include "clock"
--- @include "license"
--- @include "outcome"
--- @include "dedupe"
--- @include "rate_limit"
--- @include "events"
--- @include "owners"

-- The service's settings, ARGV[7], as a table; parsed once per distinct
-- value (in the function library the last one parsed is kept from call to
-- call, and every worker of a deployment sends the same; a Lua string
-- compares by identity).
local service_raw, SERVICE
local function service()
  local raw = ARGV[7]
  if raw ~= service_raw then
    local sl, ll, rw, dw, ht, keep, win, per, ar, as, aw, claim, rest =
      string.match(raw, '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)(.*)$')
    if not sl or (rest ~= '' and string.sub(rest, 1, 1) ~= '|') then
      error('ARGV[7] is not the service settings: ' .. raw)
    end
    SERVICE = {session_limit = tonumber(sl), license_limit = tonumber(ll), rate_window = tonumber(rw),
      dedupe_window = tonumber(dw), heartbeat_timeout = tonumber(ht), keep_ms = tonumber(keep),
      denials_window = tonumber(win), denials_per_window = tonumber(per),
      app_requests = tonumber(ar), app_sessions = tonumber(as), app_waiters = tonumber(aw),
      claim_ms = tonumber(claim)}
    SERVICE.replies = reply_conf_of(string.sub(rest, 2))
    service_raw = raw
  end
  return SERVICE
end

-- Queues the event of outcome `r` of `session`'s request, if it has one
-- (a change, or a denial: EVENT_OF, events.lua), after the notes' events
-- or, with EV.request_first, before them (release and revoke free the seat
-- they grant). Its user and group are EV.who's, set by decide (an acquire's
-- asker, the released or revoked session's owner record; false: none),
-- else the session's owner record's.
local function request_event(r, session)
  local kind = EVENT_OF[r[1]]
  if not kind or r[7] ~= 1 then
    return
  end
  local who = EV.who
  if who == nil then
    who = owner_of(session)
  end
  local detail = r[4]
  if #EV.pending == 0 and not who and detail == 0 and (kind == 'acquired' or kind == 'released') then
    -- The common case, the call's only event and nothing to add to it:
    -- written at once, without the pending list (events.lua).
    local now = r[5]
    append_event(kind, session, nil, ms(r[2]), ms(r[3]), now, ms(now))
    return
  end
  local f = add_who({}, who)
  if kind == 'denied' then
    local S = service()
    local record, folded, due = denial_sample(K.denials, r[5], S.denials_window, S.denials_per_window)
    if due > 0 then
      r[10] = due
    end
    if record == 0 then
      return
    end
    f[#f + 1], f[#f + 2] = 'reason', r[1]
    if folded > 0 then
      f[#f + 1], f[#f + 2] = 'folded', folded
    end
  elseif kind == 'queued' then
    f[#f + 1], f[#f + 2] = 'priority', type(detail) == 'table' and ms(detail[2]) or '0'
  elseif kind == 'revoked' then
    f[#f + 1], f[#f + 2] = 'held', detail
    for _, v in ipairs(EV.extra) do
      f[#f + 1] = v
    end
  elseif type(detail) == 'number' and detail > 0 then
    if kind == 'acquired' then
      f[#f + 1], f[#f + 2] = 'borrowed_until_ms', string.format('%d', detail)
    elseif kind == 'released' then
      f[#f + 1], f[#f + 2] = 'linger_ms', string.format('%d', detail)
    end
  end
  if EV.request_first then
    table.insert(EV.pending, 1, {kind, session, f})
  else
    event_later(kind, session, f)
  end
end

-- Runs one request: returns its outcome, the Redis clock it ran at and the
-- service's heartbeat timeout (service()), for the script's due report
-- (due.lua).
--   A redelivered entry's stored outcome is returned as it is (a replay).
--   A request past its deadline (ARGV[6]) is answered REQUEST_EXPIRED,
--   before the lease check and the rate limits, and nothing else is done.
--   `refuse`, when given, is called as refuse(session, lease, now) with the
--   script's session and lease hash, and returns its LEASE_MISMATCH outcome
--   or nil, then what it learned on the way for decide (seat_lease.lua).
--   It runs before the rate limits and a refusal is not counted in them,
--   so a caller without the lease cannot use up the holder's budget and
--   get its heartbeats refused. (Revoke passes none: it is the
--   administrator's way around a lease.)
--   `limited` says whether this op is rate limited at all (release is not:
--   giving a seat back always works; nor is an administrator's revoke).
--   Else decide(now, default_timeout, learned) makes the decision and
--   returns its outcome (`learned`: refuse's second result); what the due
--   report needs of what it read (the heartbeat timeout in force, the
--   heartbeat's stale time) it leaves in the script's locals.
-- Every outcome but a replay is remembered under the request's key (dedupe.lua).
local function run_request(decide, limited, refuse, session, lease)
  local now = now_ms()
  local S = service()
  EV.keep_ms = S.keep_ms
  EV.reply_conf = S.replies
  local default_timeout = S.heartbeat_timeout
  local key = ARGV[1]
  if ARGV[3] ~= '0' then
    if ARGV[3] == '2' then
      -- Keyed by the caller's id: only the holder of the lease makes or
      -- finds the record (a caller without it could otherwise answer
      -- another's request in advance).
      key = (lease or '') .. key
    end
    local previous = replay(key, now)
    if previous then
      return previous, now, default_timeout
    end
  end
  local deadline = tonumber(ARGV[6])
  local result, learned = nil, nil
  if deadline > 0 and now > deadline then
    result = outcome('REQUEST_EXPIRED', rcall('ZCARD', K.holders), seats_total(), 0, now, {}, 0)
  elseif refuse then
    result, learned = refuse(session, lease, now)
  end
  if not result then
    local limit = limited and rate_limited(now, session, S.session_limit, S.license_limit, S.rate_window, S.app_requests)
    if limit then
      result = outcome('RATE_LIMITED', rcall('ZCARD', K.holders), seats_total(), limit, now, {})
    else
      result = decide(now, default_timeout, learned)
    end
  end
  request_event(result, session)
  flush_events(result[2], result[3], now)
  return remember(key, ARGV[2], S.dedupe_window, result), now, default_timeout
end
