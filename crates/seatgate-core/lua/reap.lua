--[[
  reap: one reaper step for one license. Evicts sessions whose last heartbeat
  is older than the heartbeat timeout, frees lingering and borrowed seats
  whose linger or borrow ended (includes/owners.lua), drops waiters whose
  wait ran out, hands
  free seats to the queue (self-healing: a seat freed by any path, even one
  whose event was lost, goes to the next waiter within one reaper period),
  and hands out again outbox notes whose deliverer died (or lost Redis)
  before delivering them. Seats go to the queue only while the license may
  hand them out: never from a record that breaks its rules
  (includes/license.lua), whose stale sessions and waits are still ended.

  Every part is bounded by ARGV[2], the limit: at most that many stale
  sessions, ended lingers, ended borrows and expired waiters, read off the
  low end of the holders, lingering, borrowed and deadlines ZSETs, at most
  that many grants (under the license's policies, includes/policy.lua,
  which look past at most SKIP_LIMIT waiters), and at most that many outbox
  notes handed out, from one HSCAN page (COUNT = limit) or from the due notes
  a previous step's page held beyond the limit. (A hashtable's page holds
  about COUNT notes; a small outbox kept as a listpack comes back whole, at
  most hash-max-listpack-entries of them.) Cost is thus proportional to the
  work done, not to the sessions held or the outbox's size. When work is
  left, the step says `more` and the reaper calls it again, passing back the
  outbox position, until `more` is 0; so no single call blocks Redis for long.

  The outage rule (docs/failure-modes.md): time the service was away does not
  count against heartbeats. A session is evicted only when its last
  heartbeat is older than H - timeout, where H = min(now, ARGV[5]) (a
  heartbeat still unread in a requests stream was sent in time), and only
  once H - timeout >= ARGV[6] (every holder gets a whole timeout after the
  service resumed). Nor is a session evicted that never heard of its seat:
  granted from the queue, no heartbeat since, its GRANTED still in the
  outbox. Sessions left stale this way stay due (the stale time reported is
  then in the past), so a later pass evicts them.

  KEYS[1]  the license record; its other keys derived (includes/keys.lua)
  KEYS[2]  where its events go (events.lua)
  ARGV[1]  heartbeat timeout (ms) when the license sets no heartbeat_timeout_ms
  ARGV[2]  limit: most evictions, waiter removals, grants and re-delivered notes
  ARGV[3]  age (ms) after which an undelivered outbox note is handed out again
  ARGV[4]  outbox cursor: '0' starts a scan of the outbox; '' means this pass
           has scanned it through; else the cursor the last step returned
  ARGV[5]  read watermark (Redis ms): the time of the oldest request not yet
           decided in any requests stream; 0 when none waits
  ARGV[6]  resumed_at (Redis ms): when service last resumed after a gap (a
           Redis outage or restart, no reaper); 0 for none known
  ARGV[7]  the license id, ARGV[8] the events retention, ms (events.lua)
  ARGV[9]  on one Redis node, the queue reply settings (includes/outbox.lua,
           reply_conf_of): the step then writes the GRANTED and QUEUE_TIMEOUT
           of its notes itself; '' on a cluster (the outbox)
  ARGV[10] the claim window (ms), queue.claim_ms: how
           long a session granted a seat from the queue has to claim it with
           a heartbeat (queue.lua, claim_score; 0 = none)
  ARGV[11..] note ids the last step's page held beyond the limit, handed out
           (if still there) before the scan goes on

  Returns {seats_used, seats_total, now_ms, evicted, notes, more, queue_depth,
           redeliver, outbox_cursor, outbox_pending, borrow_ended,
           linger_ended, seats_lingering, seats_borrowed, stale, due,
           heartbeat_timeout_ms, deleted, held}
    seats_used, seats_total  after the step
    now_ms       the Redis clock
    evicted      sessions evicted (each a seat-freed event, reason
                 heartbeat_timeout, or unclaimed for a grant never claimed)
    notes        GRANTED / QUEUE_TIMEOUT notes made by this step (includes/outbox.lua)
    more         1 when work is left: call again with the returned position
    queue_depth  sessions still waiting
    redeliver    outbox notes to deliver again, as notes, at most `limit`
    outbox_cursor, outbox_pending  ARGV[4] and ARGV[10..] for the next step;
                 '' and {} once the scan is through
    borrow_ended, linger_ended  seats freed because their borrow or linger
                 ended (seat-freed events, reasons borrow_ended, linger_ended)
    seats_lingering, seats_borrowed  of seats_used, those lingering and borrowed
    stale, due   the license's times for the due index after this step
                 (ms; includes/due.lua), 0 for none: when its oldest holder
                 goes stale, and when it next has other work (a queue, a
                 linger or borrow ending, an outbox still holding replies:
                 once they may be handed out again, ARGV[3] from now; a
                 denial window that folded denials ending). The
                 reaper files them.
    heartbeat_timeout_ms  the heartbeat timeout in force, which a GRANTED
                 reply carries
    deleted      sessions whose seat ended because the license record is
                 gone (each a seat-freed event, reason license_deleted); its
                 waiters' LICENSE_NOT_FOUND notes are in `notes`
    held         how many sessions stale by now - timeout the outage rule (or an
                 undelivered grant) kept from eviction in this step
  A list slot that is empty comes back as nil (outcome.lua, list_or_nil).
  A redelivered GRANTED note goes out only while its session still holds a
  seat, whose heartbeat clock then starts again (ZADD XX: the grant counts
  from its delivery; a borrowed seat keeps its end), with that time as its
  held_since_ms (the note's 7th slot, outbox.lua); else it goes out as
  SESSION_NOT_ACTIVE, the final answer that the unclaimed grant was taken
  back (src/runtime/publish.rs gives its error).
  src/engine/scripts/reply.rs decodes this reply (Reaped).
  Records its events itself (events.lua), in the order of the changes:
  `evicted` for every seat ended (reason borrow_ended, linger_ended,
  heartbeat_timeout or license_deleted), then the notes' (granted,
  queue_timeout, denied LICENSE_NOT_FOUND), after the aggregate `denied`
  (`folded`, no session) of denials an ended window folded (denial_sample.lua),
  recorded first. A note handed out again
  records nothing: its event was recorded with the change.
]]
local rcall = redis.call
--- @include "keys"
--- @include "clock"
--- @include "license"
--- @include "outbox"
--- @include "queue"
--- @include "owners"
--- @include "policy"
--- @include "grant"
--- @include "due"
--- @include "deleted"
--- @include "events"
--- @include "outcome"

local default_timeout, limit, max_age = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cursor = ARGV[4]
local watermark, resumed_at = tonumber(ARGV[5]) or 0, tonumber(ARGV[6]) or 0
local pending = {}
EV.license, EV.keep_ms = ARGV[7], tonumber(ARGV[8])
EV.reply_conf = reply_conf_of(ARGV[9])
use_claim(default_timeout, tonumber(ARGV[10]) or 0)
for i = 11, #ARGV do
  pending[#pending + 1] = ARGV[i]
end
local now = now_ms()
-- What an ended denial window folded (denial_sample.lua) goes out as one
-- aggregate `denied` event (no session, no reason, `folded` the count);
-- while a window that folded runs, its end is when this license is due.
local denials_folded, denials_due = denial_flush(K.denials, now)
if denials_folded > 0 then
  event_later('denied', '', {'folded', denials_folded})
end

-- The note (outbox.lua) of outbox field `id` and its decoded record `n`,
-- to hand out again. A GRANTED goes out only with its seat (see the header).
-- Here, not in outbox.lua: only the reaper hands out notes again, and a
-- helper costs its closure on every run of each script that carries it.
local function outbox_note(id, n)
  local kind, since = n.kind, n.at
  if kind == 'GRANTED' then
    local score = rcall('ZSCORE', K.holders, n.session)
    if not score or score == LINGERING then
      kind = 'SESSION_NOT_ACTIVE'
    elseif not rcall('ZSCORE', K.borrowed, n.session) then
      -- Its claim window, if any, starts again too (queue.lua, claim_score).
      since = claim_score(now) or now
      rcall('ZADD', K.holders, 'XX', ms(since), n.session)
    end
  end
  return {kind, n.session, n.id, n.reply_to, n.waited_ms, id, since, 0, n.reason or ''}
end

-- Whether stale `session` was granted its seat from the queue and never
-- heard of it: no heartbeat since, and its GRANTED still in the outbox
-- (note ids are "GRANTED:<session>:<grant time>", the session record's
-- acquired_at); and, second, whether it never claimed it: no heartbeat
-- since a grant, whose claim window (queue.lua, claim_score) scored it
-- before its acquired_at.
local function unheard_grant(session)
  local record = rcall('HGET', K.sessions, session)
  if not record then
    return false, false
  end
  local acquired_at, heartbeats = parse_session_record(record)
  if heartbeats ~= 0 then
    return false, false
  end
  -- HGET, not HEXISTS: the worker's ACL user has the one (ops/redis-users.acl).
  if rcall('HGET', K.outbox, 'GRANTED:' .. session .. ':' .. acquired_at) ~= false then
    return true, false
  end
  local score = tonumber(rcall('ZSCORE', K.holders, session))
  return false, score ~= nil and score < tonumber(acquired_at)
end

-- Up to `limit` outbox notes older than `max_age` that this step did not
-- just make (`fresh`): first the ones the last page held beyond the limit,
-- else those of the next HSCAN page. Due notes of the page beyond the limit
-- are returned as pending, so every note of every page is handed out once a
-- pass, whether or not its delivery succeeds (a rescan of the page would not
-- do: a hashtable's HSCAN page grows over further buckets as notes are
-- delivered). Returns the notes, the next cursor and the pending ids.
local function scan_outbox(now, fresh)
  local out, rest = {}, {}
  if #pending > 0 then
    for _, id in ipairs(pending) do
      if #out >= limit then
        rest[#rest + 1] = id
      elseif not fresh[id] then
        local raw = rcall('HGET', K.outbox, id)
        if raw then
          out[#out + 1] = outbox_note(id, cjson.decode(raw))
        end
      end
    end
    return out, cursor, rest
  end
  if cursor == '' then
    return out, '', rest
  end
  local page = rcall('HSCAN', K.outbox, cursor, 'COUNT', ARGV[2])
  local cutoff = now - max_age
  for i = 1, #page[2], 2 do
    local id = page[2][i]
    if not fresh[id] then
      local n = cjson.decode(page[2][i + 1])
      if n.at <= cutoff then
        if #out < limit then
          out[#out + 1] = outbox_note(id, n)
        else
          rest[#rest + 1] = id
        end
      end
    end
  end
  if page[1] == '0' then
    return out, '', rest
  end
  return out, page[1], rest
end

local notes = {}

-- The record is gone: end what is left on the license, hand out its outbox.
if rcall('EXISTS', K.license) == 0 then
  local deleted, more = end_deleted(now, notes, limit)
  local fresh = {}
  for _, n in ipairs(notes) do
    fresh[n[6]] = true
  end
  local redeliver, next_cursor, next_pending = scan_outbox(now, fresh)
  if next_cursor ~= '' or #next_pending > 0 then
    more = 1
  end
  flush_events(0, 0, now)
  if EV.replies then
    send_queue_replies({'', 0, 0, 0, now, notes, 1, 0, 0, 0, default_timeout})
  end
  local _, stale_at, work_at = due_report(nil, now, default_timeout, default_timeout, now + max_age)
  if denials_due > 0 and (work_at == 0 or denials_due < work_at) then
    work_at = denials_due
  end
  return {0, 0, now, false, list_or_nil(notes), more, 0, list_or_nil(redeliver), next_cursor,
    list_or_nil(next_pending), false, false, 0, 0, stale_at, work_at, default_timeout, list_or_nil(deleted), 0}
end

local license = license_state(now)
-- The license's own timeout when it is valid; else the default (a record
-- that breaks its rules still has its stale sessions evicted).
local timeout = license.heartbeat_timeout_ms or default_timeout

-- Ended first: a borrowed seat is scored with its end, and must be freed
-- as borrow_ended, not found stale a timeout later.
local borrow_ended = owners().end_seats(K.borrowed, now, limit, 'borrow_ended')
local linger_ended = owners().end_seats(K.lingering, now, limit, 'linger_ended')
-- Stale: last heartbeat strictly older than H - timeout (the outage rule,
-- in the header).
-- Numbers go to Redis as strings made with '%d' (clock.lua's ms): Lua would
-- write each with '%.17g', which was a tenth of this script's instructions.
local horizon = now
if watermark > 0 and watermark < now then
  horizon = watermark
end
local stale, candidates, skipped = {}, {}, false
-- Whether the outage rule moved the line at all.
local ruled = horizon < now or horizon - timeout < resumed_at
if horizon - timeout >= resumed_at then
  candidates = rcall('ZRANGEBYSCORE', K.holders, '-inf', '(' .. ms(horizon - timeout), 'LIMIT', '0', ARGV[2])
end
for _, session in ipairs(candidates) do
  local unheard, unclaimed = unheard_grant(session)
  if unheard then
    skipped = true
  else
    stale[#stale + 1] = session
    rcall('ZREM', K.holders, session)
    rcall('HDEL', K.sessions, session)
    local owner = owner_of(session)
    if owner then
      owners().gone(session, owner)
    end
    event_later('evicted', session,
      add_who({'reason', unclaimed and 'unclaimed' or 'heartbeat_timeout'}, owner))
  end
end
-- Those left stale by now - timeout (at most `limit` counted; ZCOUNT is not
-- among the worker's commands): only read when the rule or a grant held any.
local held = 0
if ruled or skipped then
  held = #rcall('ZRANGEBYSCORE', K.holders, '-inf', '(' .. ms(now - timeout), 'LIMIT', '0', ARGV[2])
end
local expired = expire_waiters(now, notes, limit)
-- Waiters that stopped showing they are alive, under the same outage rule
-- as the holders: none while the service has not been back a timeout.
if expired < limit and horizon - timeout >= resumed_at then
  expired = expired + expire_stale_waiters(now, horizon, notes, limit - expired)
end

local total = license.total
local used, granted = grant_if_valid(license, now, notes, limit)

local fresh = {}
for _, n in ipairs(notes) do
  fresh[n[6]] = true
end
local redeliver, next_cursor, next_pending = scan_outbox(now, fresh)

local more = 0
if #stale >= limit or #borrow_ended >= limit or #linger_ended >= limit or expired >= limit
    or granted >= limit or next_cursor ~= '' or #next_pending > 0 then
  more = 1
end
flush_events(used, total, now)
if EV.replies then
  send_queue_replies({'', used, total, 0, now, notes, 1, 0, 0, 0, timeout})
end
local _, stale_at, work_at = due_report(nil, now, default_timeout, timeout, now + max_age)
if denials_due > 0 and (work_at == 0 or denials_due < work_at) then
  work_at = denials_due
end
return {used, total, now, list_or_nil(stale), list_or_nil(notes), more, rcall('ZCARD', K.queue),
  list_or_nil(redeliver), next_cursor, list_or_nil(next_pending), list_or_nil(borrow_ended),
  list_or_nil(linger_ended), rcall('ZCARD', K.lingering), rcall('ZCARD', K.borrowed),
  stale_at, work_at, timeout, false, held}
