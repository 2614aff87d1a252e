--[[
  deleted: ending everything on a license whose record is gone, the one
  place it is done. delete_license.lua runs it right after it deletes the
  record (`seatgate license delete`); reap.lua runs it on a license whose
  record another system deleted (a plain DEL of KEYS[1]).

  Every holder's seat ends (lingering and borrowed seats too: an `evicted`
  event each, reason license_deleted, events.lua) and every
  waiter's wait ends, with a LICENSE_NOT_FOUND note (outbox.lua) to the
  waiter: its final reply, kept in the outbox until delivered like a
  QUEUE_TIMEOUT, so a deliverer's crash does not lose it. The outbox itself
  stays: it holds those notes. Once nobody is left, the license's other keys
  (holders to queue_seq, owners, lingering, borrowed: counters, owner
  records, arrival numbers) go.
]]
--- @include "keys"
--- @include "clock"
--- @include "outbox"
--- @include "queue"
--- @include "owners"

-- How long a deleted license's holders are told so (ms): the tombstone
-- K.deleted (keys.lua) lives this long. A day: far beyond any heartbeat
-- timeout, so a holder that comes back after an outage hears why too.
local DELETED_KEEP_MS = 86400000

-- Ends up to `limit` seats and up to `limit` waits of the license at `now`,
-- adding a LICENSE_NOT_FOUND note per waiter to `notes`. Returns the
-- sessions whose seat ended, and 1 when some are left (call again), else 0.
local function end_deleted(now, notes, limit)
  -- HSET and PEXPIRE, not SET PX: the commands the admin ACL user has.
  rcall('HSET', K.deleted, 'at', ms(now))
  rcall('PEXPIRE', K.deleted, DELETED_KEEP_MS)
  local held = rcall('ZRANGE', K.holders, '0', ms(limit - 1))
  for _, session in ipairs(held) do
    rcall('ZREM', K.holders, session)
    rcall('HDEL', K.sessions, session)
    local owner = owner_of(session)
    if owner then
      owners().gone(session, owner)
    end
    event_later('evicted', session, add_who({'reason', 'license_deleted'}, owner))
  end
  local waiting = rcall('ZRANGE', K.queue, '0', ms(limit - 1))
  for _, session in ipairs(waiting) do
    end_wait(session, now, notes, 'LICENSE_NOT_FOUND')
  end
  if #held >= limit or #waiting >= limit then
    return held, 1
  end
  -- Nobody is left: what remains are records without a session (a waiter
  -- record or deadline out of its queue, a stray count), and the counters.
  rcall('DEL', K.sessions, K.waiters, K.deadlines, K.queue_seq, K.owners, K.lingering, K.borrowed)
  return held, 0
end
