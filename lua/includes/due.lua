--[[
  due: when the reaper next has work on this license. The seat scripts and
  reap.lua report it; the worker and the reaper file it in the due index
  (src/runtime/due.rs), two ZSETs per shard that lie in another Redis
  Cluster slot than the license, so no script here writes them:

    stale  when the oldest holder goes stale: its last heartbeat + the
           heartbeat timeout + 1 ms (the first moment reap.lua finds it
           stale); 0 when nobody holds a seat. While anyone does, this only
           ever moves later (a new holder's heartbeat is now, a heartbeat or
           a release moves the oldest on), so a report of it may be filed as
           it is, whatever order the filings arrive in.
           A lingering seat (scored +inf, owners.lua) is never stale, and a
           borrowed one is scored with its end, so goes stale after it.
    due    when it next has other work: at once while anyone waits in its
           queue (every pass then looks at it, so a wait that ran out ends,
           and a seat freed outside the scripts, a seats_total raised, a
           license made active again, reaches the queue within one reaper
           period), else the earliest of its first linger end, its first
           borrow end, and `outbox_due` while its outbox holds an
           undelivered reply; 0 for never. This moves earlier and later (a
           shorter borrow ends first), so it is filed with ZADD LT only.
]]
--- @include "keys"
--- @include "license"

-- The heartbeat timeout in force: the record's heartbeat_timeout_ms when it
-- keeps the rule (license.lua), else `default`, the service's.
local function heartbeat_timeout(default)
  local raw = rcall('HGET', K.license, 'heartbeat_timeout_ms')
  return raw and license_number('heartbeat_timeout_ms', raw) or default
end

-- When the oldest holder goes stale under heartbeat timeout `timeout` (ms),
-- or 0 when nobody holds a seat.
local function stale_due(timeout)
  local oldest = rcall('ZRANGE', K.holders, 0, 0, 'WITHSCORES')[2]
  if oldest and oldest ~= 'inf' then
    return tonumber(oldest) + timeout + 1
  end
  return 0
end

-- When the license next has other work than stale holders (ms), or 0 for
-- never; `outbox_due` is when an undelivered reply makes it due.
local function work_due(now, outbox_due)
  if rcall('EXISTS', K.queue) == 1 then
    return now
  end
  local due = 0
  local function earlier(at)
    if at and (due == 0 or at < due) then
      due = at
    end
  end
  earlier(tonumber(rcall('ZRANGE', K.lingering, 0, 0, 'WITHSCORES')[2]))
  earlier(tonumber(rcall('ZRANGE', K.borrowed, 0, 0, 'WITHSCORES')[2]))
  if rcall('EXISTS', K.outbox) == 1 then
    earlier(outbox_due)
  end
  return due
end
