--[[
  owners: who holds each seat, for the per-user and per-group policies
  (policy.lua), and the seats held without heartbeats: lingering and
  borrowed ones. KEYS[9..11] (keys.lua).

  KEYS[9] owners, a HASH:
    u:<user>     seats the user holds, lingering and borrowed ones included
                 (the field goes at 0)
    g:<group>    the same per group
    s:<session>  the owner record of a holder or waiter:
                   "<user>|<group>|<borrow_ms>"
                     user, group  as the acquire carried them ('' = none;
                                  ids never contain '|')
                     borrow_ms    the borrow the acquire asked for (0 = none):
                                  a waiter's grant starts it
                 Written for every session whose acquire carried a user, a
                 group or a borrow, and for every lingering seat: a session
                 with none of them (the common case) costs one HGET of a
                 missing field when its seat goes. Rust reads it with
                 engine::records::OwnerRecord (seatgate status).
  Every change of a holder keeps the counts, in the script making it: a
  seat taken or granted adds to them; a seat released without linger,
  evicted, or whose linger or borrow ended takes from them.

  KEYS[10] lingering, KEYS[11] borrowed: ZSETs session -> when the seat
  comes back (ms); the reaper frees it then. Meanwhile the seat stays in
  holders, so seats_used counts it: a lingering one scored +inf (the stale
  scan never takes it, and acquire, release and heartbeat tell it from a
  live seat by that score alone), a borrowed one scored with its end (which
  a heartbeat, ZADD XX GT, never lowers).
]]
--- @include "keys"

-- The owner record of an acquire, or nil when it carries nothing to record.
local function owner_record(user, group, borrow_ms)
  if user == '' and group == '' and borrow_ms == 0 then
    return nil
  end
  return user .. '|' .. group .. '|' .. borrow_ms
end

-- {user, group, borrow_ms} of owner record `raw`; nil for none (or a
-- record of another form).
local function parse_owner(raw)
  if not raw then
    return nil
  end
  local user, group, borrow_ms = string.match(raw, '^([^|]*)|([^|]*)|(%d+)$')
  if not user then
    return nil
  end
  return {user = user, group = group, borrow_ms = tonumber(borrow_ms)}
end

local function owner_of(session)
  return parse_owner(rcall('HGET', K.owners, 's:' .. session))
end

local function bump(field, delta)
  if rcall('HINCRBY', K.owners, field, delta) <= 0 then
    rcall('HDEL', K.owners, field)
  end
end

-- Adds `delta` seats to the counts of `owner`'s user and group.
local function count_owner(owner, delta)
  if owner.user ~= '' then
    bump('u:' .. owner.user, delta)
  end
  if owner.group ~= '' then
    bump('g:' .. owner.group, delta)
  end
end

-- Holds the seat `session` holds until `now + borrow_ms` without heartbeats.
-- Returns the borrow's end.
local function borrow_seat(session, now, borrow_ms)
  local until_ms = now + borrow_ms
  rcall('ZADD', K.holders, until_ms, session)
  rcall('ZADD', K.borrowed, until_ms, session)
  return until_ms
end

-- Counts the seat `session` was just given (taken or granted) for `owner`
-- (nil: nobody to count) and starts the borrow it asked for. Returns the
-- borrow's end, or 0.
local function seat_taken(session, now, owner)
  if not owner then
    return 0
  end
  count_owner(owner, 1)
  if owner.borrow_ms > 0 then
    return borrow_seat(session, now, owner.borrow_ms)
  end
  return 0
end

-- Forgets `session`'s owner record and counts once its seat is gone
-- (released, evicted, its linger or borrow ended). `owner` is the record
-- when the caller read it already (false: it read none); nil: read it here.
local function seat_gone(session, owner)
  if owner == nil then
    owner = owner_of(session)
  end
  if not owner then
    return
  end
  count_owner(owner, -1)
  rcall('HDEL', K.owners, 's:' .. session)
  rcall('ZREM', K.lingering, session)
  rcall('ZREM', K.borrowed, session)
end

-- Forgets a waiter's owner record (its wait ended without a seat).
local function waiter_gone(session)
  rcall('HDEL', K.owners, 's:' .. session)
end

-- Keeps the seat `session` released with it for `linger_ms`: the seat stays
-- in holders (at +inf) and in the counts until the reaper frees it.
-- Returns the linger's end.
local function linger_seat(session, now, linger_ms, owner)
  local until_ms = now + linger_ms
  rcall('ZADD', K.holders, 'XX', '+inf', session)
  rcall('ZADD', K.lingering, until_ms, session)
  rcall('ZREM', K.borrowed, session)
  if not owner then
    rcall('HSET', K.owners, 's:' .. session, '||0')
  end
  return until_ms
end

-- Whether a holders score `score` (as ZSCORE returns it) is a lingering seat's.
local function lingers(score)
  return score == 'inf'
end

-- Gives `session` its lingering seat back at `now`, heartbeat clock restarted.
local function reclaim_seat(session, now)
  rcall('ZREM', K.lingering, session)
  rcall('ZADD', K.holders, now, session)
end

-- Frees up to `limit` seats of `zset` (lingering or borrowed) whose end has
-- come. Returns their sessions.
local function end_seats(zset, now, limit)
  local due = rcall('ZRANGEBYSCORE', zset, '-inf', now, 'LIMIT', 0, limit)
  for _, session in ipairs(due) do
    rcall('ZREM', K.holders, session)
    rcall('HDEL', K.sessions, session)
    seat_gone(session)
  end
  return due
end
