--[[
  owners: who holds each seat, for the per-user and per-group policies
  (policy.lua), and the seats held without heartbeats: lingering and
  borrowed ones. K.owners, K.lingering, K.borrowed (keys.lua).

  K.owners, a HASH:
    u:<user>     seats the user holds, lingering and borrowed ones included
                 (the field goes at 0)
    g:<group>    the same per group
    w:<user>     sessions the user has waiting in the queue (the field goes
                 at 0), for queue_max_per_user (policy.lua): added by
                 acquire when it queues a session with a user, taken by
                 remove_waiter (queue.lua), the one way out of the queue
    wg:<group>   the same per group, for queue_max_per_group
    a:<app>      seats the application holds, for tenancy.application_sessions
                 (request.lua; the field goes at 0); the application of a
                 session is what precedes the '/' of its id (app_of)
    wa:<app>     sessions the application has waiting, for
                 tenancy.application_waiters (like w:<user>)
    s:<session>  the owner record of a holder or waiter:
                   "<user>|<group>|<borrow_ms>"
                     user, group  as the acquire carried them ('' = none;
                                  ids never contain '|')
                     borrow_ms    the borrow the acquire asked for (0 = none):
                                  a waiter's grant starts it
                 Written for every session whose acquire carried a user, a
                 group or a borrow, for every session of an application
                 (so that its seat is counted in a:<app> and its end finds
                 the count to take from) and for every lingering seat: a
                 session with none of them (the common case, on the shared
                 stream) costs one HGET of a missing field when its seat goes. Rust reads it with
                 engine::records::OwnerRecord (seatgate status).
  Every change of a holder keeps the counts, in the script making it: a
  seat taken or granted adds to them; a seat released without linger,
  evicted, or whose linger or borrow ended takes from them.

  K.lingering, K.borrowed: ZSETs session -> when the seat
  comes back (ms); the reaper frees it then. Meanwhile the seat stays in
  holders, so seats_used counts it: a lingering one scored +inf (the stale
  scan never takes it, and acquire, release and heartbeat tell it from a
  live seat by that score alone), a borrowed one scored with its end (which
  a heartbeat, ZADD XX GT, never lowers).

  Cost: a Lua function costs its closure on every run of a script, so only
  owner_of is defined on every run; the other helpers are built by owners()
  the first time a run needs them.
]]
--- @include "keys"
--- @include "events"

-- The application whose session (user, group) `id` is: what precedes the
-- '/' of '<app>/<id>' (src/tenancy.rs); nil for a plain id.
local function app_of(id)
  return string.match(id, '^([^/]+)/')
end

-- {user, group, borrow_ms, app} of `session`'s owner record; nil for none (or a
-- record of another form). The one parser of the record: `raw` is the record
-- when the caller read it already, with others (false: none); nil reads it.
local function owner_of(session, raw)
  if raw == nil then
    raw = rcall('HGET', K.owners, 's:' .. session)
  end
  if not raw then
    return nil
  end
  local user, group, borrow_ms = string.match(raw, '^([^|]*)|([^|]*)|(%d+)$')
  if not user then
    return nil
  end
  return {user = user, group = group, borrow_ms = tonumber(borrow_ms), app = app_of(session)}
end

-- A lingering seat's holders score, as ZSCORE returns it.
local LINGERING = 'inf'

local owners_built
-- The other owner helpers.
local function owners()
  if owners_built then
    return owners_built
  end
  local O = {}

  -- The owner record of an acquire by `session`, or nil when it carries
  -- nothing to record (nor is an application's session).
  function O.record(user, group, borrow_ms, session)
    if user == '' and group == '' and borrow_ms == 0 and not app_of(session) then
      return nil
    end
    return user .. '|' .. group .. '|' .. borrow_ms
  end

  local function bump(field, delta)
    if rcall('HINCRBY', K.owners, field, delta) <= 0 then
      rcall('HDEL', K.owners, field)
    end
  end

  -- Adds `delta` seats to the counts of `owner`'s user and group.
  local function count(owner, delta)
    if owner.user ~= '' then
      bump('u:' .. owner.user, delta)
    end
    if owner.group ~= '' then
      bump('g:' .. owner.group, delta)
    end
    if owner.app then
      bump('a:' .. owner.app, delta)
    end
  end

  -- Holds the seat `session` holds until `now + borrow_ms` without
  -- heartbeats. Returns the borrow's end.
  local function borrow(session, now, borrow_ms)
    local until_ms = now + borrow_ms
    rcall('ZADD', K.holders, until_ms, session)
    rcall('ZADD', K.borrowed, until_ms, session)
    return until_ms
  end

  -- Counts the seat `session` was just given (taken or granted) for `owner`
  -- and starts the borrow it asked for. Returns the borrow's end, or 0.
  function O.taken(session, now, owner)
    count(owner, 1)
    if owner.borrow_ms > 0 then
      return borrow(session, now, owner.borrow_ms)
    end
    return 0
  end

  -- Forgets `session`'s owner record `owner` and its counts once its seat
  -- is gone (released, evicted, its linger or borrow ended).
  function O.gone(session, owner)
    count(owner, -1)
    rcall('HDEL', K.owners, 's:' .. session)
    rcall('ZREM', K.lingering, session)
    rcall('ZREM', K.borrowed, session)
  end

  -- Keeps the seat `session` released with it for `linger_ms`: the seat
  -- stays in holders (at +inf) and in the counts until the reaper frees it.
  function O.linger(session, now, linger_ms, owner)
    rcall('ZADD', K.holders, 'XX', '+inf', session)
    rcall('ZADD', K.lingering, now + linger_ms, session)
    rcall('ZREM', K.borrowed, session)
    if not owner then
      rcall('HSET', K.owners, 's:' .. session, '||0')
    end
  end

  -- Gives `session` its lingering seat back at `now`, heartbeat clock restarted.
  function O.reclaim(session, now)
    rcall('ZREM', K.lingering, session)
    rcall('ZADD', K.holders, now, session)
  end

  -- Forgets a waiter's owner record: its wait ended without a seat.
  function O.forget(session)
    rcall('HDEL', K.owners, 's:' .. session)
  end

  -- Frees up to `limit` seats of `zset` (lingering or borrowed) whose end
  -- has come, each an `evicted` event with `reason`. Returns their sessions.
  function O.end_seats(zset, now, limit, reason)
    local due = rcall('ZRANGEBYSCORE', zset, '-inf', ms(now), 'LIMIT', '0', ms(limit))
    for _, session in ipairs(due) do
      rcall('ZREM', zset, session)
      rcall('ZREM', K.holders, session)
      rcall('HDEL', K.sessions, session)
      local owner = owner_of(session)
      if owner then
        O.gone(session, owner)
      end
      event_later('evicted', session, add_who({'reason', reason}, owner))
    end
    return due
  end

  owners_built = O
  return O
end
