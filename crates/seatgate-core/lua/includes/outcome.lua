--[[
  outcome: the reply of acquire, release, heartbeat and revoke, the one
  place its shape is described. src/engine/scripts/reply.rs decodes it
  (Outcome), and tests/it/scripts.rs runs each script against it.

    [1] status       the decision, a wire status (src/engine/status.rs)
    [2] seats_used   seats held after the script ran
    [3] seats_total  the license's seat count (0 when there is no license)
    [4] detail       HEARTBEAT_UPDATED: the heartbeat count;
                     QUEUED: the 1-based queue position, or {position,
                     priority} for a priority above 0;
                     NO_SEATS_AVAILABLE: 'queue_full' when the queue is full,
                     'queue_user_full' when the user's waiters reach
                     queue_max_per_user, 'queue_group_full' when the
                     group's reach queue_max_per_group,
                     'reserved' when the free seats are reserved for others;
                     LIMIT_REACHED: the limit, 'max_per_user', 'group_max'
                     or 'max_borrow_ms';
                     ACQUIRED: the borrow's end (ms) for a borrowed seat;
                     RELEASED: linger_ms when the seat lingers;
                     SESSION_REVOKED: the revocation record, JSON (revoked.lua);
                     SESSION_NOT_ACTIVE (heartbeat), SESSION_NOT_FOUND
                     (release): 'license_deleted' when the license has
                     no record and was deleted within a day;
                     REVOKED: 1 when the session held a seat, 0 when it waited;
                     otherwise 0
    [5] now_ms       the Redis clock when the script ran
    [6] notes        waiters granted or timed out on the way (outbox.lua);
                     none: false (nil to Redis, see replied below)
    [7] changed      1, or 0 when the call changed nothing that deserves an
                     event (a re-sent QUEUED, a replay)
    [8] replayed     1 when this is the stored reply of a stream entry decided
                     before (dedupe.lua), else 0
    [9] stale        when the license's oldest holder goes stale (ms,
                     due.lua), reported when the call may have moved it (a
                     seat taken or granted, the oldest holder's heartbeat, a
                     replay); else 0: nothing to file
    [10] due         when the license next has other work for the reaper
                     (ms, due.lua), reported when the call may have brought
                     it forward (a place queued, a note made, a borrowed
                     seat taken, a seat left lingering, a replay); else 0:
                     nothing to file
    [11] heartbeat_timeout_ms  the heartbeat timeout in force for the
                     license (its own, else the service's), which ACQUIRED,
                     ALREADY_ACTIVE, GRANTED and HEARTBEAT_UPDATED replies
                     carry: on those statuses and with notes, else 0
                     (HEARTBEAT_UPDATED's is filled in by heartbeat.lua)
    [12] held_since_ms  acquire's ACQUIRED and ALREADY_ACTIVE only (else
                     absent): when the seat's heartbeat clock last started
                     (due.lua), which those replies carry
  The worker files [9] and [10] in the due index. [9]..[11] are filled in
  last (due.lua, due_report), from the state the script leaves, replays
  included: the dedupe record keeps only [1..6].
]]

local function outcome(status, used, total, detail, now, notes, changed)
  return {status, used, total, detail, now, notes, changed or 1, 0, 0, 0, 0}
end

-- `list`, or false (a nil reply) when it is empty: an empty list costs
-- Redis about 4.7 thousand instructions more to hand back than a nil
-- (ops/callgrind.sh). For the lists of a reply only, its last step:
-- src/engine/scripts/reply.rs reads a nil list as an empty one.
local function list_or_nil(list)
  if next(list) == nil then
    return false
  end
  return list
end

-- `result` as a request script returns it to Redis: its notes through
-- list_or_nil. The notes are a list up to here.
local function replied(result)
  result[6] = list_or_nil(result[6])
  return result
end
