--[[
  queue: the wait queue, KEYS[4..7] (keys.lua).

  A waiter's score in KEYS[4] is its arrival number (KEYS[7]) minus its
  priority times 2^40 (policy.lua): higher priority first, FIFO within one.

  The waiter record, the value of a waiting session in KEYS[5] (waiters),
  the one place it is built and parsed in Lua; Rust reads it with
  engine::records::WaiterRecord (seatgate status). The compact form:
    "<queued_at>.<id>\n<reply_to>\n<meta>"              bound to no lease
    "<queued_at>~<lease_hash><id>\n<reply_to>\n<meta>"  bound to one
      queued_at   when it joined the queue (Redis clock, ms), in base 36
                  (digits and lowercase letters: 8 of them, not 13)
      lease_hash  the hash of the lease the place (and the seat granted from
                  it) is bound to (lease.lua), its 64 bits in 11 characters
                  of LEASE64 (5 fewer than the 16 hex digits every other
                  reader sees: the parser gives those back)
      id          the request id the later GRANTED / QUEUE_TIMEOUT (or
                  SESSION_REVOKED) carries
      reply_to    where that reply goes: '' = nowhere; '*<rest>' for
                  'seat:reply:<rest>' (the default replies.prefix, spelt
                  out in nearly every record otherwise); '=<reply_to>' for
                  any other
      meta        the metadata JSON object, as sent, the seat will be stored
                  with; last, so it may hold anything, newlines included
  The protocol refuses control characters in an id and a reply_to, so
  neither holds a newline; should a caller of the scripts pass one anyway,
  the record is written in the JSON form below instead, which still reads.
  Why so tight: at 10,000 waiters on one license the record's string is
  allocated in 16-byte steps, so ~15 bytes fewer is one step fewer
  (docs/performance.md, "Where a queued waiter's bytes go").

  Records written by earlier versions, still in Redis after an upgrade,
  read as well (a waiter queued before it is granted, timed out or revoked
  as it would have been), and are rewritten in the compact form only when a
  re-sent acquire redirects them:
    plain  "<queued_at>:<lease_hash>:<id>\n<reply_to>\n<meta>" (decimal
           queued_at, 16 hex digits or nothing, reply_to as it is)
    JSON   {"id", "reply_to", "meta", "queued_at", "lease_hash"?}
  A JSON record starts with '{'; the plain form has a ':' after its digits,
  the compact one a '.' or '~' after its base-36 digits.
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

-- The waiter record's alphabets (above): base 36 for queued_at, and 64
-- characters for the lease hash, 12 bits (three hex digits) per two.
local BASE36 = '0123456789abcdefghijklmnopqrstuvwxyz'
local LEASE64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
-- The default replies.prefix, written '*' in a record's reply_to.
local DEFAULT_REPLY_PREFIX = 'seat:reply:'

-- The record of a waiter that queued at `queued_at` (ms: a number, or the
-- digits of a record read back), bound to lease hash `lease` ('' = none,
-- else 16 hex digits).
local function encode_waiter_record(queued_at, lease, id, reply_to, meta)
  queued_at = tonumber(queued_at)
  if string.find(id, '\n', 1, true) or string.find(reply_to, '\n', 1, true)
      or (lease ~= '' and (#lease ~= 16 or string.find(lease, '[^0-9a-f]')))
      or not (queued_at >= 0 and queued_at < 2 ^ 53 and queued_at == math.floor(queued_at)) then
    -- Never from a request the worker let through (see above), nor from a
    -- record the scripts wrote: only a JSON record of a foreign hand, kept
    -- exactly as it came when a re-sent acquire redirects it.
    local w = {id = id, reply_to = reply_to, meta = meta, queued_at = queued_at}
    if lease ~= '' then
      w.lease_hash = lease
    end
    return cjson.encode(w)
  end
  -- Exact: a time in ms is far below 2^53.
  local at, n = {}, queued_at
  repeat
    local d = n % 36
    table.insert(at, 1, string.sub(BASE36, d + 1, d + 1))
    n = (n - d) / 36
  until n == 0
  local bound = '.'
  if lease ~= '' then
    local c = {'~'}
    for i = 1, 15, 3 do
      local g = tonumber(string.sub(lease, i, i + 2), 16)
      local hi, lo = math.floor(g / 64) + 1, g % 64 + 1
      c[#c + 1] = string.sub(LEASE64, hi, hi) .. string.sub(LEASE64, lo, lo)
    end
    local last = tonumber(string.sub(lease, 16, 16), 16) + 1
    c[#c + 1] = string.sub(LEASE64, last, last)
    bound = table.concat(c)
  end
  if reply_to ~= '' then
    if string.sub(reply_to, 1, #DEFAULT_REPLY_PREFIX) == DEFAULT_REPLY_PREFIX then
      reply_to = '*' .. string.sub(reply_to, #DEFAULT_REPLY_PREFIX + 1)
    else
      reply_to = '=' .. reply_to
    end
  end
  return table.concat(at) .. bound .. id .. '\n' .. reply_to .. '\n' .. meta
end

-- The waiter record of `session`, read in any form: a table
-- {queued_at (number), lease_hash ('' for none, else 16 hex digits), id,
-- reply_to, meta}; nil when it has none, or one of no form (then treated
-- as gone).
local function waiter_record(session)
  local raw = rcall('HGET', K.waiters, session)
  if not raw then
    return nil
  end
  local at, bound, rest, reply_to, meta = string.match(raw, '^([0-9a-z]+)([.~])([^\n]*)\n([^\n]*)\n(.*)$')
  if at then
    local w = {queued_at = tonumber(at, 36), lease_hash = '', reply_to = '', meta = meta}
    if bound == '~' then
      local c, hex = string.sub(rest, 1, 11), {}
      if #c ~= 11 or string.find(c, '[^A-Za-z0-9_-]') then
        return nil
      end
      for i = 1, 9, 2 do
        local hi = string.find(LEASE64, string.sub(c, i, i), 1, true) - 1
        local lo = string.find(LEASE64, string.sub(c, i + 1, i + 1), 1, true) - 1
        hex[#hex + 1] = string.format('%03x', hi * 64 + lo)
      end
      local last = string.find(LEASE64, string.sub(c, 11, 11), 1, true) - 1
      if last > 15 then
        return nil
      end
      hex[#hex + 1] = string.format('%x', last)
      w.lease_hash = table.concat(hex)
      rest = string.sub(rest, 12)
    end
    w.id = rest
    local mark = string.sub(reply_to, 1, 1)
    if mark == '*' then
      w.reply_to = DEFAULT_REPLY_PREFIX .. string.sub(reply_to, 2)
    elseif mark == '=' then
      w.reply_to = string.sub(reply_to, 2)
    elseif reply_to ~= '' then
      return nil
    end
    return w
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
  local queued_at, lease, id, plain_reply_to, plain_meta = string.match(raw, '^(%d+):(%x*):([^\n]*)\n([^\n]*)\n(.*)$')
  if not queued_at or (lease ~= '' and #lease ~= 16) then
    return nil
  end
  return {queued_at = tonumber(queued_at), lease_hash = lease, id = id, reply_to = plain_reply_to, meta = plain_meta}
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
