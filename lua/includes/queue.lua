--[[
  queue: the wait queue, KEYS[4..7] (keys.lua).

  The waiter record, the value of a waiting session in KEYS[5] (waiters),
  JSON; Rust reads it with engine::records::WaiterRecord (seatgate status):
    {"id", "reply_to", "meta", "queued_at", "lease_hash"?}
      id          the request id the later GRANTED / QUEUE_TIMEOUT (or
                  SESSION_REVOKED) carries
      reply_to    where that reply goes ('' = nowhere)
      meta        the metadata JSON, as a string, the seat will be stored with
      queued_at   when it joined the queue (Redis clock, ms)
      lease_hash  the hash of the lease the place (and the seat granted from
                  it) is bound to (lease.lua); absent when bound to none
]]
--- @include "keys"
--- @include "outbox"
--- @include "session_record"

-- Puts `session` at the back of the queue until `now + wait_ms`, bound to
-- lease hash `lease` ('' = none).
local function enqueue(session, now, wait_ms, request_id, reply_to, meta, lease)
  rcall('ZADD', K.queue, rcall('INCR', K.queue_seq), session)
  rcall('ZADD', K.deadlines, now + wait_ms, session)
  local w = {id = request_id, reply_to = reply_to, meta = meta, queued_at = now}
  if lease ~= '' then
    w.lease_hash = lease
  end
  rcall('HSET', K.waiters, session, cjson.encode(w))
end

-- The lease hash `session`'s place in the queue is bound to: '' for none,
-- nil when it does not wait.
local function waiter_lease(session)
  local raw = rcall('HGET', K.waiters, session)
  if not raw then
    return nil
  end
  return cjson.decode(raw).lease_hash or ''
end

local function remove_waiter(session)
  rcall('ZREM', K.queue, session)
  rcall('ZREM', K.deadlines, session)
  rcall('HDEL', K.waiters, session)
end

-- Removes up to `limit` waiters whose wait ran out, noting QUEUE_TIMEOUT for each.
-- Returns how many it removed.
local function expire_waiters(now, notes, limit)
  local due = rcall('ZRANGEBYSCORE', K.deadlines, '-inf', now, 'LIMIT', 0, limit)
  for _, session in ipairs(due) do
    local raw = rcall('HGET', K.waiters, session)
    remove_waiter(session)
    if raw then
      note(notes, now, 'QUEUE_TIMEOUT', session, cjson.decode(raw))
    end
  end
  return #due
end

-- Hands free seats to the head of the queue, in arrival order, noting GRANTED
-- for each, at most `max` of them (a seats_total raised by thousands under a
-- long queue is granted over several calls). Only call it when the license
-- may hand out seats. Returns the seats in use afterwards and the grants made.
local function promote(now, total, notes, max)
  local used = rcall('ZCARD', K.holders)
  local granted = 0
  while used < total and granted < max do
    local head = rcall('ZRANGE', K.queue, 0, 0)[1]
    if not head then
      break
    end
    local raw = rcall('HGET', K.waiters, head)
    remove_waiter(head)
    if raw then
      local w = cjson.decode(raw)
      rcall('ZADD', K.holders, now, head)
      start_session(head, now, w.meta, w.lease_hash or '')
      used = used + 1
      granted = granted + 1
      note(notes, now, 'GRANTED', head, w)
    end
  end
  return used, granted
end
