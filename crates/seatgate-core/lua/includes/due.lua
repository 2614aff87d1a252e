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
           undelivered reply, and the end of a denial window that folded
           denials (denial_sample.lua); 0 for never. This moves earlier and later (a
           shorter borrow ends first), so it is filed with ZADD LT only.

  One function for both callers: a Lua function costs its closure on every
  run of a script (measured: about 0.6 µs of Redis time each, and each
  call into Redis about as much), so the seat scripts pay for one, for no
  read unless their call may have moved a time, and for none of what they
  read already (the timeout, the heartbeat's stale time).
]]
--- @include "keys"
--- @include "license"

-- With `result`, an outcome of a seat script (outcome.lua): fills in its
-- [9]..[11] and returns it, only where the call may have changed them, so
-- that a call that changed nothing of them reads nothing more:
--   stale (a read of the oldest holder) after a note made (a grant), and
--     after a seat taken by the license's only holder, whose time it then
--     is without a read (its score: now, or the borrow's end); a seat
--     taken beside older holders moves nothing (unless those all linger,
--     when the stale time is filed once their linger ends);
--   other work after a place queued, a note made, a borrowed seat taken
--     (ACQUIRED, detail its end) or a seat left lingering (RELEASED, detail
--     linger_ms; policy.lua); a new outbox note makes the license due at
--     once: the worker normally delivers it first, and the reaper's look
--     then finds it gone (or, if still there, not yet old enough to hand
--     out again);
--   both after a replay (its first delivery may have died before filing);
--   the heartbeat timeout on the replies that carry it;
--   with `session` (acquire), [12] held_since_ms on ACQUIRED and
--     ALREADY_ACTIVE, replays included: when the seat's heartbeat clock
--     last started, its score in the holders (the seat taken, or its last
--     heartbeat; now for a borrowed or lingering one, which no heartbeat
--     keeps), or, for a replay whose seat is gone, the first decision's time.
-- (heartbeat.lua, which only ever moves the stale time on, fills in its own.)
-- Without `result` (reap.lua): returns the heartbeat timeout in force, the
-- stale time and the other-work time, with an undelivered reply due at
-- `outbox_due`.
-- `default` is the service's heartbeat timeout (ms); `timeout`, the one in
-- force, when the script read it already (else nil).
local function due_report(result, now, default, timeout, outbox_due, session)
  local stale, work, holds, alone, queued = true, true, false, false, false
  -- A due time the script set already: a denial window's end, when the
  -- request's denial was the window's first folded (request.lua).
  local also = 0
  if result then
    also = tonumber(result[10]) or 0
    for i = 9, 11 do
      -- A replay (dedupe.lua) comes with [1..8] only.
      result[i] = result[i] or 0
    end
    local status, notes = result[1], result[6]
    local replayed, changed = result[8] == 1, result[7] == 1
    local ends = (status == 'ACQUIRED' or status == 'RELEASED') and result[4] ~= 0
    alone = changed and not replayed and status == 'ACQUIRED' and #notes == 0 and result[2] == 1
    queued = changed and not replayed and status == 'QUEUED'
    stale = replayed or #notes > 0
    work = replayed or #notes > 0 or (changed and (status == 'QUEUED' or ends))
    holds = status == 'ACQUIRED' or status == 'ALREADY_ACTIVE' or #notes > 0
    if not (stale or work or holds) then
      return result
    end
    outbox_due = now
  end
  timeout = timeout or heartbeat_timeout(default)
  local stale_at, work_at = 0, 0
  if alone then
    stale_at = math.max(now, tonumber(result[4]) or 0) + timeout + 1
  elseif stale then
    local oldest = rcall('ZRANGE', K.holders, '0', '0', 'WITHSCORES')[2]
    if oldest and oldest ~= 'inf' then
      stale_at = tonumber(oldest) + timeout + 1
    end
  end
  if work then
    -- A call that just queued its session (QUEUED, changed, no replay)
    -- knows the queue is there without asking.
    if queued or rcall('EXISTS', K.queue) == 1 then
      work_at = now
    else
      local ends = {
        rcall('ZRANGE', K.lingering, '0', '0', 'WITHSCORES')[2],
        rcall('ZRANGE', K.borrowed, '0', '0', 'WITHSCORES')[2],
      }
      if rcall('EXISTS', K.outbox) == 1 then
        ends[3] = outbox_due
      end
      for _, at in pairs(ends) do
        at = tonumber(at)
        if work_at == 0 or at < work_at then
          work_at = at
        end
      end
    end
  end
  if also > 0 and (work_at == 0 or also < work_at) then
    work_at = also
  end
  if not result then
    return timeout, stale_at, work_at
  end
  result[9], result[10] = stale_at, work_at
  if holds then
    result[11] = timeout
  end
  if session and (result[1] == 'ACQUIRED' or result[1] == 'ALREADY_ACTIVE') then
    -- A seat this call took (ACQUIRED, not a replay) was scored now, or
    -- later for a borrowed one: its clock started now, without a read.
    local score = now
    if result[1] == 'ALREADY_ACTIVE' or result[8] == 1 then
      score = tonumber(rcall('ZSCORE', K.holders, session))
    end
    if not score then
      score = tonumber(result[5]) or now
    elseif score > now then
      score = now
    end
    result[12] = score
  end
  return result
end
