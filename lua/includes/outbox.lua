--[[
  outbox: notes, the follow-up work a script reports, and their copies in
  KEYS[8] (outbox) until delivered.

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
  (or reaper) sends each to its reply_to, publishes the event and HDELs it;
  reap.lua hands out again the notes a crash left there.
]]
--- @include "keys"

-- Adds a note for waiter record `w` (queue.lua) to `notes` and, when it has
-- somewhere to go, to the outbox.
local function note(notes, now, kind, session, w)
  local id = kind .. ':' .. session .. ':' .. now
  local waited = now - w.queued_at
  if w.reply_to ~= '' then
    rcall('HSET', K.outbox, id, cjson.encode({
      kind = kind, session = session, id = w.id, reply_to = w.reply_to, waited_ms = waited, at = now,
    }))
  end
  notes[#notes + 1] = {kind, session, w.id, w.reply_to, waited, id, now}
end
