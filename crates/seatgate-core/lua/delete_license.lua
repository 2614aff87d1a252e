--[[
  delete_license: `seatgate license delete` (src/runtime/reaper.rs,
  Reaper::delete_license). Deletes the license record and ends everything
  on the license (includes/deleted.lua), atomically, at most ARGV[1] seats
  and ARGV[1] waits per call: the first call deletes the record, so from
  its moment on every request for the license is answered
  LICENSE_NOT_FOUND and no seat is handed out; the caller calls again
  while `more` says so. The revocation keys (K.revoked, K.revocations) go with the
  last call; the outbox stays until its notes are delivered.

  KEYS[1]     the license record; its other keys derived (includes/keys.lua)
  KEYS[2]     where its events go (includes/events.lua): its event counter
              stays, so a license made again goes on with the next seq
  ARGV[1]     limit: most seats and most waits ended by this call
  ARGV[2]     the license id, ARGV[3] the events retention, ms (events.lua)
  ARGV[4]     the actor, for the `license_deleted` event

  Returns {existed, now_ms, ended, notes, more}
    existed  1 when this call deleted the record, else 0
    now_ms   the Redis clock
    ended    sessions whose seat ended (each an `evicted` event, reason
             license_deleted)
    notes    a LICENSE_NOT_FOUND note per waiter (includes/outbox.lua),
             each also in the outbox until delivered
    more     1 when seats or waits are left: call again
  src/engine/scripts/reply.rs decodes this reply (Deleted).
  Records its events itself (includes/events.lua): first, on the call that
  deletes the record, `license_deleted` (includes/admin.lua: actor, before
  the record as it was, after `{}`), then `evicted` (reason
  license_deleted, seats 0 of 0) per seat ended, `denied` (reason
  LICENSE_NOT_FOUND) per waiter.
]]
local rcall = redis.call
--- @include "keys"
--- @include "clock"
--- @include "deleted"
--- @include "admin"

local now = now_ms()
EV.license, EV.keep_ms = ARGV[2], tonumber(ARGV[3])
local record = rcall('HGETALL', K.license)
local existed = rcall('DEL', K.license)
if existed == 1 then
  event_later('license_deleted', '', {'actor', ARGV[4], 'before', record_json(record), 'after', '{}'})
end
local notes = {}
local ended, more = end_deleted(now, notes, tonumber(ARGV[1]))
flush_events(0, 0, now)
if more == 0 then
  rcall('DEL', K.revoked, K.revocations)
end
return {existed, now, ended, notes, more}
