--[[
  seat_lease: the lease check of acquire and release, which look at both a
  session's seat and its place in the queue (lease.lua; heartbeat looks at
  the seat only).
]]
--- @include "session_record"
--- @include "queue"
--- @include "lease"

-- LEASE_MISMATCH when `session` holds a seat, or else waits, bound to
-- another lease than hash `lease`; nil when the request may go on. The
-- `refuse` of run_request (request.lua). Its second result says whether
-- `session` has a session record: false means it holds no seat, lingering
-- or not (a holder always has one, session_record.lua), so decide need not
-- ask holders.
local function seat_lease_refusal(session, lease, now)
  local bound = holder_lease(session)
  local seated = bound ~= nil
  if not seated and not nobody_waits() then
    local w = waiter_record(session)
    bound = w and w.lease_hash
  end
  return lease_refusal(now, bound, lease), seated
end
