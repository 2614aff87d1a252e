--[[
  outbox: notes, the follow-up work a script reports, and their copies in
  K.outbox until delivered.

  A note, as it appears in a script's reply (decoded by
  src/engine/scripts/reply.rs, Note):
    {kind, session, request_id, reply_to, waited_ms, note_id, held_since_ms[, delivery]}
      kind      GRANTED (a waiter now holds a seat), QUEUE_TIMEOUT (a
                waiter gave up), SESSION_REVOKED (an administrator took
                the waiter's place away, revoke.lua) or LICENSE_NOT_FOUND
                (the license was deleted while it waited, deleted.lua);
                reap.lua hands out a GRANTED whose seat is gone as
                SESSION_NOT_ACTIVE
      note_id   its field in the outbox: "<kind>:<session>:<now_ms>"
      held_since_ms  when the granted seat's heartbeat clock started (Redis
                ms): the grant, or its redelivery (reap.lua), which a
                GRANTED reply carries
      delivery  1 when the script wrote the queue reply itself, 2 when it
                could not (dropped); absent: the caller delivers it
  On one Redis node (the service settings say so, request.lua, and
  reap.lua's ARGV[9]), a request script or a reaper step writes the
  GRANTED and QUEUE_TIMEOUT of its notes to the waiters' reply streams
  itself, in the same atomic step as the grant or the
  timeout (send_queue_replies): the reply can then not be lost with the
  worker, and the hot license's hand-over of a seat costs no outbox record
  and no further round trips. On a cluster the reply stream lies in
  another slot, which a script may not touch, and the note goes through
  the outbox as below; so do the SESSION_REVOKED and LICENSE_NOT_FOUND
  ones, which are rare.
  The outbox record, the field's value, JSON:
    {"kind", "session", "id", "reply_to", "waited_ms", "at"}   (at = now_ms)
  Notes with a reply_to are kept in the outbox until delivered: the worker
  (or reaper) sends each to its reply_to and HDELs it; reap.lua hands out
  again the notes a crash left there. The note's event (granted,
  queue_timeout, or denied with reason LICENSE_NOT_FOUND; none for
  SESSION_REVOKED: the revoke's own `revoked` tells it) is recorded here,
  with the change (events.lua): a note delivered again publishes nothing.
]]
--- @include "keys"
--- @include "events"

-- Adds a note for waiter record `w` (queue.lua) to `notes` and, when it has
-- somewhere to go, to the outbox; queues its event, carrying the user and
-- group of owner record `owner` (owners.lua; nil for none).
local function note(notes, now, kind, session, w, owner, reason)
  local id = kind .. ':' .. session .. ':' .. ms(now)
  local waited = now - w.queued_at
  local n = {kind, session, w.id, w.reply_to, waited, id, now, 0, reason or ''}
  if w.reply_to ~= '' then
    if EV.reply_conf and (kind == 'GRANTED' or kind == 'QUEUE_TIMEOUT') then
      -- One node: the script writes it itself, at its end
      -- (send_queue_replies, which marks it 2 should that fail). Marked
      -- now, so that the request's dedupe record, written before, says so.
      n[8] = 1
      local pending = EV.replies or {}
      pending[#pending + 1] = n
      EV.replies = pending
    else
      rcall('HSET', K.outbox, id, cjson.encode({
        kind = kind, session = session, id = w.id, reply_to = w.reply_to, waited_ms = waited, at = now,
        reason = reason,
      }))
    end
  end
  notes[#notes + 1] = n
  if kind == 'GRANTED' then
    event_later('granted', session, add_who({'waited_ms', ms(waited)}, owner))
  elseif kind == 'QUEUE_TIMEOUT' then
    local fields = {'waited_ms', ms(waited)}
    if reason then
      fields[3], fields[4] = 'reason', reason
    end
    event_later('queue_timeout', session, add_who(fields, owner))
  elseif kind == 'LICENSE_NOT_FOUND' then
    event_later('denied', session, add_who({'reason', kind, 'waited_ms', ms(waited)}, owner))
  end
end

-- The queue reply settings the worker or reaper hands a script on one
-- node, '<reply ttl>|<reply expiry>|<replies.prefix>' (ttl and expiry ms;
-- src/engine/scripts.rs, queue_replies_arg), as EV.reply_conf wants them;
-- nil for '' (a cluster: notes go to the outbox). The last one parsed is
-- kept: every call of a deployment sends the same string.
local reply_conf_raw, reply_conf_parsed
local function reply_conf_of(raw)
  if raw == '' then
    return nil
  end
  if raw ~= reply_conf_raw then
    local ttl, expiry, prefix = string.match(raw, '^(%d+)|(%d+)|(.+)$')
    if not ttl then
      error('not the queue reply settings: ' .. raw)
    end
    reply_conf_raw, reply_conf_parsed = raw, {ttl = tonumber(ttl), expiry = expiry, prefix = prefix}
  end
  return reply_conf_parsed
end

-- Writes the queue replies note() left to the script (EV.replies: one
-- node) to their waiters' reply streams, as the worker writes a reply
-- (src/runtime/publish.rs, src/engine/protocol.rs Reply::fields): trimmed
-- by age (MINID ~ now - reply ttl), the stream's idle expiry set again.
-- Marks each note's delivery slot [8]: 1 written, 2 undeliverable (its
-- stream lies outside replies.prefix or is no stream: dropped, as the
-- worker drops it). Run last, once `result` (outcome.lua) holds the seats
-- after the call and [11] the heartbeat timeout in force (due.lua), after
-- the events (an event is never later than its reply); returns `result`.
-- (reap.lua hands it a table of those slots.)
-- The error of a QUEUE_TIMEOUT whose waiter stopped showing it is alive
-- (queue.lua, expire_stale_waiters); src/runtime/publish.rs says the same.
local WAITER_STALE_ERROR = 'the waiting session sent no heartbeat for a heartbeat timeout and gave up its place'

local function send_queue_replies(result)
  local pending = EV.replies
  if not pending then
    return result
  end
  local conf = EV.reply_conf
  -- Numbers as strings: Redis writes a Lua number argument with '%.17g'
  -- (printf's floating-point path), several times the cost of ms().
  local used, total, now = ms(result[2]), ms(result[3]), result[5]
  local trim = string.format('%d', now - conf.ttl)
  local timeout = ms(result[11])
  local license = license_id()
  for _, n in ipairs(pending) do
    local reply_to = n[4]
    local sent = false
    -- The session as its caller sent it: an application's is kept as
    -- '<application>/<session>' (src/tenancy.rs).
    local session = string.match(n[2], '/(.*)$') or n[2]
    if #reply_to > #conf.prefix and string.sub(reply_to, 1, #conf.prefix) == conf.prefix then
      local r
      if n[1] == 'GRANTED' then
        r = redis.pcall('XADD', reply_to, 'MINID', '~', trim, '*', 'id', n[3], 'op', 'acquire',
          'status', 'GRANTED', 'ok', '1', 'license', license, 'session', session, 'seats_used', used,
          'seats_total', total, 'waited_ms', ms(n[5]), 'heartbeat_timeout_ms', timeout,
          'held_since_ms', string.format('%d', n[7]))
      elseif n[9] == 'waiter_stale' then
        r = redis.pcall('XADD', reply_to, 'MINID', '~', trim, '*', 'id', n[3], 'op', 'acquire',
          'status', 'QUEUE_TIMEOUT', 'ok', '0', 'license', license, 'session', session, 'seats_used', used,
          'seats_total', total, 'waited_ms', ms(n[5]), 'reason', 'waiter_stale', 'error',
          WAITER_STALE_ERROR)
      else
        r = redis.pcall('XADD', reply_to, 'MINID', '~', trim, '*', 'id', n[3], 'op', 'acquire',
          'status', 'QUEUE_TIMEOUT', 'ok', '0', 'license', license, 'session', session, 'seats_used', used,
          'seats_total', total, 'waited_ms', ms(n[5]), 'error', 'waited ' .. ms(n[5]) .. ' ms without a seat')
      end
      if not (type(r) == 'table' and r.err) then
        rcall('PEXPIRE', reply_to, conf.expiry)
        sent = true
      end
    end
    if not sent then
      n[8] = 2
    end
  end
  return result
end
