--[[
  queue: the wait queue, K.queue, K.waiters, K.deadlines, K.queue_seq (keys.lua).

  A waiter's score in K.queue is its arrival number (K.queue_seq) minus its
  priority times 2^40 (policy.lua): higher priority first, FIFO within one.

  The waiter record, the value of a waiting session in K.waiters,
  the one place it is built and parsed in Lua; Rust reads it with
  engine::records::WaiterRecord (seatgate status):
    "<queued_at>:<lease_hash>:<id>\n<reply_to>\n<meta>"
      queued_at   when it joined the queue (Redis clock, ms)
      lease_hash  the hash of the lease the place (and the seat granted from
                  it) is bound to (lease.lua): 16 lowercase hex digits, or
                  empty when bound to none
      id          the request id the later GRANTED / QUEUE_TIMEOUT (or
                  SESSION_REVOKED) carries
      reply_to    where that reply goes ('' = nowhere)
      meta        the metadata JSON object, as sent, the seat will be stored
                  with; last, so it may hold anything, newlines included
  The protocol refuses control characters in an id and a reply_to, so
  neither holds a newline; should a caller of the scripts pass one anyway,
  the record is written in the JSON form below instead, which still reads.

  A plain string rather than JSON: no field names, no escaped quotes in the
  metadata, so a record is ~50 bytes shorter (seatgate bench --only memory).
  Records written before it, JSON
    {"id", "reply_to", "meta", "queued_at", "lease_hash"?}
  (lease_hash absent when bound to none), read as well: a waiter queued
  before an upgrade is granted, timed out or revoked as it would have been.
  A JSON record always starts with '{', the plain form with a digit.
  Putting a session in the queue and redirecting a waiter's answer are
  acquire's alone (enqueue, redirect_waiter in acquire.lua).
]]
--- @include "keys"
--- @include "clock"
--- @include "outbox"
--- @include "session_record"
--- @include "owners"

-- 2^40: one priority level in a queue score. Arrival numbers stay below it,
-- and scores within +-10 * 2^40, far below 2^53: exact as doubles.
local PRIORITY_STEP = 1099511627776

-- The record of a waiter that queued at `queued_at` (ms: a number, or the
-- digits of a record read back), bound to lease hash `lease` ('' = none).
local function encode_waiter_record(queued_at, lease, id, reply_to, meta)
  if type(queued_at) == 'number' then
    queued_at = string.format('%d', queued_at)
  end
  if string.find(id, '\n', 1, true) or string.find(reply_to, '\n', 1, true) then
    -- Never from a request the worker let through (see above).
    local w = {id = id, reply_to = reply_to, meta = meta, queued_at = tonumber(queued_at)}
    if lease ~= '' then
      w.lease_hash = lease
    end
    return cjson.encode(w)
  end
  return queued_at .. ':' .. lease .. ':' .. id .. '\n' .. reply_to .. '\n' .. meta
end

-- The waiter record of `session`, read in either form: a table
-- {queued_at (number), lease_hash ('' for none), id, reply_to, meta}; nil
-- when it has none, or one of neither form (then treated as gone).
local function waiter_record(session)
  local raw = rcall('HGET', K.waiters, session)
  if not raw then
    return nil
  end
  if string.byte(raw, 1) == 123 then -- '{'
    local ok, w = pcall(cjson.decode, raw)
    if not (ok and type(w) == 'table' and type(w.queued_at) == 'number' and type(w.id) == 'string'
        and type(w.reply_to) == 'string' and type(w.meta) == 'string') then
      return nil
    end
    w.lease_hash = w.lease_hash or ''
    return w
  end
  local queued_at, lease, id, reply_to, meta = string.match(raw, '^(%d+):(%x*):([^\n]*)\n([^\n]*)\n(.*)$')
  if not queued_at or (lease ~= '' and #lease ~= 16) then
    return nil
  end
  return {queued_at = tonumber(queued_at), lease_hash = lease, id = id, reply_to = reply_to, meta = meta}
end

-- Takes waiting `session`, whose owner record is `owner` (nil: none), out
-- of the queue: every way a wait ends (a grant, a timeout, a release, a
-- revocation, the license deleted) goes through here, so the per-user
-- waiter count (owners.lua, `w:<user>`, for queue_max_per_user) is taken
-- from here, once: only when the session was still queued.
local function remove_waiter(session, owner)
  local queued = rcall('ZREM', K.queue, session)
  rcall('ZREM', K.deadlines, session)
  rcall('HDEL', K.waiters, session)
  if queued == 1 and owner and owner.user ~= '' then
    local field = 'w:' .. owner.user
    if rcall('HINCRBY', K.owners, field, -1) <= 0 then
      rcall('HDEL', K.owners, field)
    end
  end
end

-- Removes up to `limit` waiters whose wait ran out, noting QUEUE_TIMEOUT for each.
-- Returns how many it removed.
local function expire_waiters(now, notes, limit)
  local due = rcall('ZRANGEBYSCORE', K.deadlines, '-inf', ms(now), 'LIMIT', '0', ms(limit))
  for _, session in ipairs(due) do
    local w = waiter_record(session)
    local owner = owner_of(session)
    remove_waiter(session, owner)
    owners().forget(session)
    if w then
      note(notes, now, 'QUEUE_TIMEOUT', session, w, owner)
    end
  end
  return #due
end

-- Gives waiting `session` a seat, noting GRANTED. Returns false when its
-- waiter record was gone or unreadable (it only leaves the queue).
local function grant(session, now, notes)
  local w = waiter_record(session)
  local owner = owner_of(session)
  remove_waiter(session, owner)
  if not w then
    return false
  end
  rcall('ZADD', K.holders, ms(now), session)
  start_session(session, now, w.meta, w.lease_hash)
  if owner then
    owners().taken(session, now, owner)
  end
  note(notes, now, 'GRANTED', session, w, owner)
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
