--[[
  events: the seat events a script records itself, in the same atomic step
  as the change each one describes, so every change has exactly one event
  whatever happens to the process that called the script (docs/internals.md,
  "Exactly-once events"). The one place an event entry is written.

  Its keys, in the license's slot (keys.lua):
    KEYS[2]       where the events go: on one Redis node the license's
                  events shard itself (seat:events, or seat:events:{i});
                  on a cluster, where the shard is another slot, the
                  license's own log seat:{L}:events, which the relay
                  (lua/relay.lua, src/runtime/relay.rs) moves to the shard.
    K.denials     seat:{L}:denials    HASH the license's denial window
                  (denial_sample.lua): the request scripts record a bounded
                  number of `denied` events per window, the reaper records
                  one aggregate event for what the ended window folded.
    K.event_seq   seat:{L}:event_seq  STRING the license's event counter
                  (`seq`). Never deleted, not by `license delete` either, so
                  a license's seq never restarts.
  The script sets EV.keep_ms (the events
  retention, ms; 0 = never trim, the license's own log) before it records.

  An event entry (src/engine/events.rs reads it, docs/protocol.md lists it):
    type license session seats_used seats_total at_ms seq epoch
    [user] [group] [reason] [waited_ms] [actor] [held] [priority]
    [linger_ms] [borrowed_until_ms] [folded]
  `folded` (denied only, > 0): denials of the license not recorded as events
  of their own since the last one that was (denial_sample.lua); an
  aggregate `denied` event the reaper records for an ended window has no
  session and no reason, only `folded`.
  seats_used and seats_total are the license's after the script, at_ms its
  Redis clock. Events go out in the order of the changes: EV.pending holds
  them as the script makes them, flush_events writes them at its end (a
  call's only event, with no field to add, is written at once by
  request.lua, through the same append_event).

  `epoch` (EPOCH below) makes `(license, epoch, seq)` name one event for
  good, also when Redis loses writes (a restore from an older snapshot, a
  crash that loses the end of the AOF, a failover to a replica that lagged):
  the counter goes back with the data, and the next events take seq numbers
  that lost ones had. Every such loss comes with a new life of this library
  (Redis starting, a replica's full resync, a FUNCTION LOAD), and a new life
  has a new epoch, so a reissued seq never comes with its old epoch. The
  epoch is the Redis time (µs) of the life's first event, kept in the
  library's Lua state, which no snapshot holds: nothing to restore, nothing
  an operator must do. A restart that lost nothing changes it too, which
  costs nothing (docs/protocol.md, "Events"; docs/backup.md).

  Trimming (MINID ~ <now - keep_ms>) costs about 40% of an XADD even when
  nothing goes, so only one event in TRIM_EVERY of a license trims: the
  shard is still trimmed many times a minute under any load, and an event
  older than the retention stays at most until the license's next few events.
]]
--- @include "keys"
--- @include "clock"
--- @include "denial_sample"

local TRIM_EVERY = 16

local EV
-- Binds EV to this call's KEYS, nothing pending (run first, as keys.lua's
-- bind_keys).
local function bind_events()
  EV = {log = KEYS[2], license = '', keep_ms = 0, pending = {}}
end
--- @on_call "bind_events"

-- The event of a request's own outcome, by status (src/engine/events.rs,
-- EventType::for_status, pinned by a unit test there).
local EVENT_OF = {
  ACQUIRED = 'acquired', RELEASED = 'released', QUEUED = 'queued', LEFT_QUEUE = 'left_queue',
  GRANTED = 'granted', QUEUE_TIMEOUT = 'queue_timeout', REVOKED = 'revoked',
  NO_SEATS_AVAILABLE = 'denied', LICENSE_NOT_FOUND = 'denied', LICENSE_INACTIVE = 'denied',
  LICENSE_EXPIRED = 'denied', LICENSE_INVALID = 'denied', RATE_LIMITED = 'denied', LIMIT_REACHED = 'denied',
}

-- Adds `who`'s user and group (an owner record, owners.lua, or an asker)
-- to field list `f`.
local function add_who(f, who)
  if who then
    if who.user ~= '' then
      f[#f + 1] = 'user'
      f[#f + 1] = who.user
    end
    if who.group ~= '' then
      f[#f + 1] = 'group'
      f[#f + 1] = who.group
    end
  end
  return f
end

-- Queues event `kind` of `session` with extra fields `f` (a flat list).
local function event_later(kind, session, f)
  EV.pending[#EV.pending + 1] = {kind, session, f}
end

-- No extra fields.
local NO_FIELDS = {}

-- This library life's epoch (above), set by its first event: kept from
-- call to call in the function library, so a restarted or restored Redis
-- starts without one. (A script run on its own has a new one every call,
-- unique all the same.)
local EPOCH

-- The epoch, made on first use from the Redis clock: seconds and
-- microseconds, one decimal number.
local function epoch()
  if not EPOCH then
    local t = rcall('TIME')
    EPOCH = t[1] .. string.format('%06d', tonumber(t[2]))
  end
  return EPOCH
end

-- Appends event `kind` of `session` (extra fields `f`, a flat list, or
-- nil) with the license's seats after the script (`used`, `total`, as
-- '%d' strings) and its clock (`now`; `at`, the same as a string): the one
-- place an event entry is written.
local function append_event(kind, session, f, used, total, now, at)
  if EV.license == '' then
    EV.license = license_id()
  end
  local n = rcall('INCR', K.event_seq)
  local seq = string.format('%d', n)
  if EV.keep_ms > 0 and n % TRIM_EVERY == 1 and now > EV.keep_ms then
    rcall('XADD', EV.log, 'MINID', '~', string.format('%d', now - EV.keep_ms), '*', 'type', kind,
      'license', EV.license, 'session', session, 'seats_used', used, 'seats_total', total, 'at_ms', at,
      'seq', seq, 'epoch', epoch(), unpack(f or NO_FIELDS))
  else
    rcall('XADD', EV.log, '*', 'type', kind, 'license', EV.license, 'session', session,
      'seats_used', used, 'seats_total', total, 'at_ms', at, 'seq', seq, 'epoch', epoch(),
      unpack(f or NO_FIELDS))
  end
end

-- Writes the queued events, in order, with the license's seats after the
-- script and its clock.
local function flush_events(used, total, now)
  if #EV.pending == 0 then
    return
  end
  local at = ms(now)
  used, total = ms(used), ms(total)
  for _, e in ipairs(EV.pending) do
    append_event(e[1], e[2], e[3], used, total, now, at)
  end
  EV.pending = {}
end
