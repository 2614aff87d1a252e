--[[
  due: when the reaper next has work on this license. The seat scripts and
  reap.lua report it (outcome.lua [9], reap.lua's `due`); the worker and the
  reaper file it in the due index (src/runtime/due.rs), a ZSET per shard
  that lies in another Redis Cluster slot than the license, so no script
  here writes it.

  A license is due
    - at its oldest heartbeat + the heartbeat timeout + 1 ms while it has
      holders: the first moment reap.lua finds that holder stale;
    - at once while anyone waits in its queue: every pass then looks at it,
      so a wait that ran out ends, and a seat freed outside the scripts (a
      seats_total raised, a license made active again) reaches the queue,
      within one reaper period;
    - at `outbox_due` while its outbox holds an undelivered reply;
  and never (0) when none of these holds: it needs no reaper then.
]]
--- @include "keys"
--- @include "license"

-- The heartbeat timeout in force: the record's heartbeat_timeout_ms when it
-- keeps the rule (license.lua), else `default`, the service's.
local function heartbeat_timeout(default)
  local raw = rcall('HGET', K.license, 'heartbeat_timeout_ms')
  return raw and license_number('heartbeat_timeout_ms', raw) or default
end

-- The license's next due time (ms), or 0 for never, under heartbeat timeout
-- `timeout`; `outbox_due` is when an undelivered reply makes it due.
local function next_due(now, timeout, outbox_due)
  if rcall('EXISTS', K.queue) == 1 then
    return now
  end
  local due = 0
  local oldest = rcall('ZRANGE', K.holders, 0, 0, 'WITHSCORES')[2]
  if oldest then
    due = tonumber(oldest) + timeout + 1
  end
  if (due == 0 or outbox_due < due) and rcall('EXISTS', K.outbox) == 1 then
    due = outbox_due
  end
  return due
end
