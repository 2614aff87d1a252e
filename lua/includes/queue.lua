--[[
  queue: the wait queue, KEYS[4..7] (keys.lua).

  A waiter's score in KEYS[4] is its arrival number (KEYS[7]) minus its
  priority times 2^40 (policy.lua): higher priority first, FIFO within one.

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
--- @include "clock"
--- @include "outbox"
--- @include "session_record"
--- @include "owners"

-- 2^40: one priority level in a queue score. Arrival numbers stay below it,
-- and scores within +-10 * 2^40, far below 2^53: exact as doubles.
local PRIORITY_STEP = 1099511627776

-- Puts `session` in the queue, behind those of its priority (0-9), until
-- `now + wait_ms`, bound to lease hash `lease` ('' = none).
local function enqueue(session, now, wait_ms, request_id, reply_to, meta, lease, priority)
  rcall('ZADD', K.queue, rcall('INCR', K.queue_seq) - priority * PRIORITY_STEP, session)
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
  local raw = rcall('HGET', K.waiters, session)
  if not raw then
    return
  end
  local w = cjson.decode(raw)
  if w.id ~= request_id or w.reply_to ~= reply_to then
    w.id, w.reply_to = request_id, reply_to
    rcall('HSET', K.waiters, session, cjson.encode(w))
  end
end

local function remove_waiter(session)
  rcall('ZREM', K.queue, session)
  rcall('ZREM', K.deadlines, session)
  rcall('HDEL', K.waiters, session)
end

-- Removes up to `limit` waiters whose wait ran out, noting QUEUE_TIMEOUT for each.
-- Returns how many it removed.
local function expire_waiters(now, notes, limit)
  local due = rcall('ZRANGEBYSCORE', K.deadlines, '-inf', ms(now), 'LIMIT', '0', ms(limit))
  for _, session in ipairs(due) do
    local raw = rcall('HGET', K.waiters, session)
    remove_waiter(session)
    owners().forget(session)
    if raw then
      note(notes, now, 'QUEUE_TIMEOUT', session, cjson.decode(raw))
    end
  end
  return #due
end

-- Gives waiting `session` a seat, noting GRANTED. Returns false when its
-- waiter record was gone (it only leaves the queue).
local function grant(session, now, notes)
  local raw = rcall('HGET', K.waiters, session)
  remove_waiter(session)
  if not raw then
    return false
  end
  local w = cjson.decode(raw)
  rcall('ZADD', K.holders, ms(now), session)
  start_session(session, now, w.meta, w.lease_hash or '')
  local owner = owner_of(session)
  if owner then
    owners().taken(session, now, owner)
  end
  note(notes, now, 'GRANTED', session, w)
  return true
end

-- Hands free seats to the head of the queue, in queue order, noting GRANTED
-- for each, at most `max` of them (a seats_total raised by thousands under a
-- long queue is granted over several calls). Only call it when the license
-- may hand out seats. Returns the seats in use afterwards, the grants made,
-- and whether it found the queue empty.
local function promote(now, total, notes, max)
  local used = rcall('ZCARD', K.holders)
  local granted = 0
  while used < total and granted < max do
    local head = rcall('ZRANGE', K.queue, '0', '0')[1]
    if not head then
      return used, granted, true
    end
    if grant(head, now, notes) then
      used = used + 1
      granted = granted + 1
    end
  end
  return used, granted, false
end
