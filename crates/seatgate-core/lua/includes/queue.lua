--[[
  queue: the wait queue, K.queue, K.waiters, K.deadlines, K.queue_seq (keys.lua).

  A waiter's score in K.queue is its arrival number (K.queue_seq) minus its
  priority times 2^40 (policy.lua): higher priority first, FIFO within one.

  The waiter record, the value of a waiting session in K.waiters,
  the one place it is built and parsed in Lua; Rust reads it with
  engine::records::WaiterRecord (seatgate status). The compact form:
    "<queued_at>.<id>\n<reply_to>\n<meta>"              bound to no lease
    "<queued_at>~<lease_hash><id>\n<reply_to>\n<meta>"  bound to one
      queued_at   when it joined the queue (Redis clock, ms), in base 36
                  (digits and lowercase letters: 8 of them, not 13, until
                  2059)
      lease_hash  the hash of the lease the place (and the seat granted from
                  it) is bound to (lease.lua): 16 lowercase hex digits
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
  (docs/performance.md, "Where a queued waiter's bytes go"). The lease hash
  stays hex: 11 characters of base 64 would save 5 bytes and cost ~6 µs of
  Redis a waiter in Lua; raw bytes are no UTF-8 for Rust's readers.

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

-- The waiters by group, K.queue_by_group: a ZSET of members scored 0,
-- '<group>|<order>|<session>' ('' for no group; ids hold no '|', and no
-- id character sorts above it), so that ZRANGEBYLEX finds each group's
-- waiters together, in queue order (<order>: the queue score plus 2^44 in
-- twelve hex digits, which sort as the scores do), and steps from one
-- group to the next ('(' .. group .. '}': '}' follows '|'). What lets a
-- grant step skip a whole group its limit blocks at once, however many of
-- it wait (policy.lua, fair_promote). Written by enqueue (acquire.lua),
-- taken by remove_waiter, like the queue itself.
local ORDER_OFFSET = 17592186044416
local function by_group_member(group, score, session)
  return group .. '|' .. string.format('%012x', tonumber(score) + ORDER_OFFSET) .. '|' .. session
end

-- The waiters by group and user, K.queue_by_user: the same, with the
-- user between ('' for none): '<group>|<user>|<order>|<session>', so that a
-- grant step finds each user's first waiter of a group at one ZRANGEBYLEX
-- and passes over a user its own max_per_user blocks whole, however many
-- of that user wait ('(' .. group .. '|' .. user .. '}' steps to the next
-- user: every id that extends `user` sorts before `user|`). Written and
-- taken with K.queue_by_group.
local function by_user_member(group, user, score, session)
  return group .. '|' .. user .. '|' .. string.format('%012x', tonumber(score) + ORDER_OFFSET) .. '|' .. session
end

-- The digits of a waiter record's queued_at (above), and 36^8: eight of
-- them hold every ms until 2059.
local BASE36 = '0123456789abcdefghijklmnopqrstuvwxyz'
local BASE36_8 = 2821109907456
-- The default replies.prefix, written '*' in a record's reply_to.
local DEFAULT_REPLY_PREFIX = 'seat:reply:'

-- The record of a waiter that queued at `queued_at` (ms: a number, or the
-- digits of a record read back), bound to lease hash `lease` ('' = none,
-- else 16 hex digits; any other is kept in a JSON record).
local function encode_waiter_record(queued_at, lease, id, reply_to, meta)
  queued_at = tonumber(queued_at)
  if string.find(id, '\n', 1, true) or string.find(reply_to, '\n', 1, true)
      or (lease ~= '' and (#lease ~= 16 or string.find(lease, '%X')))
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
  -- Eight digits without a loop or a table (a tenth of the time of the
  -- general loop below in Redis's Lua); exact, as a time in ms is far below
  -- 2^53. Those above them, from 2059 on, the slow way.
  local n = queued_at % BASE36_8
  local high = (queued_at - n) / BASE36_8
  local d8 = n % 36; n = (n - d8) / 36
  local d7 = n % 36; n = (n - d7) / 36
  local d6 = n % 36; n = (n - d6) / 36
  local d5 = n % 36; n = (n - d5) / 36
  local d4 = n % 36; n = (n - d4) / 36
  local d3 = n % 36; n = (n - d3) / 36
  local d2 = n % 36; n = (n - d2) / 36
  local at = string.char(n < 10 and 48 + n or 87 + n, d2 < 10 and 48 + d2 or 87 + d2,
    d3 < 10 and 48 + d3 or 87 + d3, d4 < 10 and 48 + d4 or 87 + d4, d5 < 10 and 48 + d5 or 87 + d5,
    d6 < 10 and 48 + d6 or 87 + d6, d7 < 10 and 48 + d7 or 87 + d7, d8 < 10 and 48 + d8 or 87 + d8)
  while high > 0 do
    local d = high % 36
    at = string.sub(BASE36, d + 1, d + 1) .. at
    high = (high - d) / 36
  end
  local bound = lease == '' and '.' or '~' .. lease
  if reply_to ~= '' then
    if string.sub(reply_to, 1, #DEFAULT_REPLY_PREFIX) == DEFAULT_REPLY_PREFIX then
      reply_to = '*' .. string.sub(reply_to, #DEFAULT_REPLY_PREFIX + 1)
    else
      reply_to = '=' .. reply_to
    end
  end
  return at .. bound .. id .. '\n' .. reply_to .. '\n' .. meta
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
  -- One match for each compact form, failing at once on the others.
  local lease = ''
  local at, id, reply_to, meta = string.match(raw, '^([0-9a-z]+)%.([^\n]*)\n([^\n]*)\n(.*)$')
  if not at then
    at, lease, id, reply_to, meta = string.match(raw,
      '^([0-9a-z]+)~(%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x)([^\n]*)\n([^\n]*)\n(.*)$')
  end
  if at then
    local mark = string.byte(reply_to, 1)
    if mark == 42 then -- '*'
      reply_to = DEFAULT_REPLY_PREFIX .. string.sub(reply_to, 2)
    elseif mark == 61 then -- '='
      reply_to = string.sub(reply_to, 2)
    elseif mark then
      return nil
    end
    return {queued_at = tonumber(at, 36), lease_hash = lease, id = id, reply_to = reply_to, meta = meta}
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

-- Whether nobody waits: the queue and its deadlines both empty, asked of
-- Redis once per call, and only by a call that would otherwise look into
-- them. On a license nobody waits for (the common case) one EXISTS then
-- stands for the waiter record's HGET of the lease check, the deadlines'
-- ZRANGEBYSCORE, acquire's ZRANK and the queue head's ZRANGE. Only
-- acquire's enqueue adds a waiter, and says so (queue_joined).
local idle_queue
-- The claim window of this call's grants (claim_score, below): the
-- service's defaults, set by the calling script (use_claim), and what the
-- license record says, read at the call's first grant.
local claim_timeout, claim_default, claim_offset
local function bind_queue()
  idle_queue = nil
  claim_offset = nil
end
--- @on_call "bind_queue"

-- Sets the service's heartbeat timeout and claim window (ms; 0 = no
-- window) that this call's grants use where the license sets neither.
local function use_claim(timeout, claim)
  claim_timeout, claim_default = timeout, claim
end

-- The score a seat granted at `now` starts with in K.holders, or nil for
-- `now` itself: with a claim window C under heartbeat timeout T, now - T +
-- C, so that the grant goes stale C after it, unless its session claims
-- the seat with a heartbeat first (whose ZADD GT scores it now). The
-- license's claim_ms and heartbeat_timeout_ms, where set, over the
-- service's (use_claim); none when the window is 0 or not under T.
local function claim_score(now)
  if claim_offset == nil then
    local raw = rcall('HMGET', K.license, 'heartbeat_timeout_ms', 'claim_ms')
    local timeout = tonumber(raw[1]) or claim_timeout
    local claim = tonumber(raw[2]) or claim_default
    claim_offset = false
    if timeout and claim and claim > 0 and claim < timeout then
      claim_offset = timeout - claim
    end
  end
  return claim_offset and now - claim_offset or nil
end

local function nobody_waits()
  if idle_queue == nil then
    idle_queue = rcall('EXISTS', K.queue, K.deadlines) == 0
  end
  return idle_queue
end

local function queue_joined()
  idle_queue = false
end

-- Takes waiting `session`, whose owner record is `owner` (nil: none), out
-- of the queue: every way a wait ends (a grant, a timeout, a release, a
-- revocation, the license deleted) goes through here, so the per-user and
-- per-group waiter counts (owners.lua, `w:<user>` and `wg:<group>`, for
-- queue_max_per_user and queue_max_per_group) and the application's
-- (`wa:<app>`, tenancy.application_waiters) are taken from here, once:
-- only when the session was still queued.
local function remove_waiter(session, owner)
  local score = rcall('ZSCORE', K.queue, session)
  local queued = score and rcall('ZREM', K.queue, session) or 0
  rcall('ZREM', K.deadlines, session)
  rcall('ZREM', K.alive, session)
  rcall('HDEL', K.waiters, session)
  if score then
    local group, user = owner and owner.group or '', owner and owner.user or ''
    rcall('ZREM', K.queue_by_group, by_group_member(group, score, session))
    rcall('ZREM', K.queue_by_user, by_user_member(group, user, score, session))
  end
  if queued == 1 and owner then
    local fields = {owner.user ~= '' and 'w:' .. owner.user, owner.group ~= '' and 'wg:' .. owner.group,
      owner.app and 'wa:' .. owner.app}
    for i = 1, 3 do
      local field = fields[i]
      if field and rcall('HINCRBY', K.owners, field, -1) <= 0 then
        rcall('HDEL', K.owners, field)
      end
    end
  end
end

-- Removes up to `limit` waiters whose wait ran out, noting QUEUE_TIMEOUT for each.
-- Returns how many it removed.
local function expire_waiters(now, notes, limit)
  if nobody_waits() then
    return 0
  end
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

-- Removes up to `limit` waiters that showed no sign of life (a waiter
-- heartbeat, a re-sent acquire) for a heartbeat timeout, as of `horizon`
-- (reap.lua's outage rule: time the service was away counts against no
-- waiter either), noting QUEUE_TIMEOUT with reason waiter_stale for each.
-- Waiters queued by a release without K.alive are never found here.
-- Returns how many it removed.
local function expire_stale_waiters(now, horizon, notes, limit)
  if nobody_waits() then
    return 0
  end
  local stale = rcall('ZRANGEBYSCORE', K.alive, '-inf', '(' .. ms(horizon), 'LIMIT', '0', ms(limit))
  for _, session in ipairs(stale) do
    local w = waiter_record(session)
    local owner = owner_of(session)
    remove_waiter(session, owner)
    owners().forget(session)
    if w then
      note(notes, now, 'QUEUE_TIMEOUT', session, w, owner, 'waiter_stale')
    end
  end
  return #stale
end

-- Gives waiting `session` a seat, noting GRANTED; `used`: the seats in use
-- with it. Returns false when its waiter record was gone or unreadable (it
-- only leaves the queue). The seat starts its claim window (claim_score),
-- unless it is borrowed (scored with its borrow's end).
local function grant(session, now, notes, used)
  local w = waiter_record(session)
  local owner = owner_of(session)
  remove_waiter(session, owner)
  if not w then
    return false
  end
  hold(session, now, w.meta, w.lease_hash, used)
  local borrowed = 0
  if owner then
    borrowed = owners().taken(session, now, owner)
  end
  local claim_at = borrowed == 0 and claim_score(now)
  if claim_at then
    rcall('ZADD', K.holders, 'XX', ms(claim_at), session)
  end
  note(notes, now, 'GRANTED', session, w, owner)
  if claim_at then
    -- Its held_since_ms: held_since_ms + the heartbeat timeout is when the
    -- claim window ends.
    notes[#notes][7] = claim_at
  end
  return true
end

-- Hands free seats to the head of the queue, in queue order, noting GRANTED
-- for each, at most `max` of them (a seats_total raised by thousands under a
-- long queue is granted over several calls). Only call it when the license
-- may hand out seats. Returns the seats in use afterwards, the grants made,
-- and whether it found the queue empty.
local function promote(now, total, notes, max)
  local used = rcall('ZCARD', K.holders)
  if used < total and nobody_waits() then
    return used, 0, true
  end
  local granted = 0
  while used < total and granted < max do
    local head = rcall('ZRANGE', K.queue, '0', '0')[1]
    if not head then
      return used, granted, true
    end
    if grant(head, now, notes, used + 1) then
      used = used + 1
      granted = granted + 1
    end
  end
  return used, granted, false
end
