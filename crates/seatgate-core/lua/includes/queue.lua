--[[
  queue: the wait queue, K.queue, K.waiters, K.deadlines, K.queue_seq (keys.lua).

  A waiter's score in K.queue is its arrival number (K.queue_seq) minus its
  priority times 2^40 (policy.lua): higher priority first, FIFO within one.

  The waiter record is waiter_record.lua's.
  Putting a session in the queue and redirecting a waiter's answer are
  acquire's alone (enqueue, redirect_waiter in acquire.lua).
]]
--- @include "keys"
--- @include "clock"
--- @include "outbox"
--- @include "session_record"
--- @include "owners"
--- @include "license"
--- @include "waiter_record"

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

-- Whether nobody waits: the queue and its deadlines both empty, asked of
-- Redis once per call, and only by a call that would otherwise look into
-- them. On a license nobody waits for (the common case) one EXISTS then
-- stands for the waiter record's HGET of the lease check, the deadlines'
-- ZRANGEBYSCORE, acquire's ZRANK and the queue head's ZRANGE. Only
-- acquire's enqueue adds a waiter, and says so (queue_joined).
local idle_queue
-- The claim window of this call's grants (claim_score, below): the
-- service's heartbeat timeout and window, set by the calling script
-- (use_claim), and the offset they and the license's own timeout give,
-- worked out at the call's first grant.
local claim_timeout, claim_default, claim_offset
local function bind_queue()
  idle_queue = nil
  claim_offset = nil
end
--- @on_call "bind_queue"

-- Sets the service's heartbeat timeout (used where the license sets none)
-- and claim window (ms; 0 = no window) for this call's grants.
local function use_claim(timeout, claim)
  claim_timeout, claim_default = timeout, claim
end

-- The score a seat granted at `now` starts with in K.holders, or nil for
-- `now` itself: with a claim window C under heartbeat timeout T, now - T +
-- C, so that the grant goes stale C after it, unless its session claims
-- the seat with a heartbeat first (whose ZADD GT scores it now). T is the
-- license's heartbeat_timeout_ms where set, else the service's; C the
-- service's queue.claim_ms (use_claim); none when C is 0 or not under T.
local function claim_score(now)
  if claim_offset == nil then
    local timeout = heartbeat_timeout(claim_timeout)
    local claim = claim_default
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

-- Ends the wait of `session` without a seat: takes it out of the queue
-- and forgets its owner record, and notes `status` (with `reason`, if any)
-- for its waiter, when its record still reads.
local function end_wait(session, now, notes, status, reason)
  local w = waiter_record(session)
  local owner = owner_of(session)
  remove_waiter(session, owner)
  owners().forget(session)
  if w then
    note(notes, now, status, session, w, owner, reason)
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
    end_wait(session, now, notes, 'QUEUE_TIMEOUT')
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
    end_wait(session, now, notes, 'QUEUE_TIMEOUT', 'waiter_stale')
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
