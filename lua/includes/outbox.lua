--[[
  outbox: notes, the follow-up work a script reports, and their copies in
  K.outbox until delivered.

  A note, as it appears in a script's reply (decoded by
  src/engine/scripts/reply.rs, Note):
    {kind, session, request_id, reply_to, waited_ms, note_id, held_since_ms}
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
local function note(notes, now, kind, session, w, owner)
  local id = kind .. ':' .. session .. ':' .. now
  local waited = now - w.queued_at
  if w.reply_to ~= '' then
    rcall('HSET', K.outbox, id, cjson.encode({
      kind = kind, session = session, id = w.id, reply_to = w.reply_to, waited_ms = waited, at = now,
    }))
  end
  notes[#notes + 1] = {kind, session, w.id, w.reply_to, waited, id, now}
  if kind == 'GRANTED' then
    event_later('granted', session, add_who({'waited_ms', waited}, owner))
  elseif kind == 'QUEUE_TIMEOUT' then
    event_later('queue_timeout', session, add_who({'waited_ms', waited}, owner))
  elseif kind == 'LICENSE_NOT_FOUND' then
    event_later('denied', session, add_who({'reason', kind, 'waited_ms', waited}, owner))
  end
end
