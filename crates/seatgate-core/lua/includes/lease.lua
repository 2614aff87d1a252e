--[[
  lease: the caller's secret a seat (or a place in the queue) is bound to.

  An acquire may carry a lease (16 to 128 characters of A-Z a-z 0-9 _ -,
  checked by the worker); the seat it takes, or the place it queues in and
  the seat granted from it later, is then bound to it, and a heartbeat or
  release of that session must carry the same lease (LEASE_MISMATCH
  otherwise, and nothing changes). A session bound to no lease ('') admits
  every request, as before leases existed.

  Only a hash is stored, the first 16 hex digits of the lease's SHA-1, in the
  session record (session_record.lua) and the waiter record (queue.lua):
  whoever may read those records (`seatgate status`, a dashboard, the
  dashboard ACL user) must not learn a lease it could replay in a heartbeat
  or release. 64 bits keep a record small and a random lease unguessable.
]]
--- @include "keys"
--- @include "license"
--- @include "outcome"

-- The stored form of `lease` ('' stays '': no lease).
local function lease_hash(lease)
  if lease == '' then
    return ''
  end
  return string.sub(redis.sha1hex(lease), 1, 16)
end

-- LEASE_MISMATCH when a session bound to lease hash `bound` (nil: no record;
-- '': unbound) is asked about with lease hash `given`; nil when it may go on.
local function lease_refusal(now, bound, given)
  if bound == nil or bound == '' or bound == given then
    return nil
  end
  return outcome('LEASE_MISMATCH', rcall('ZCARD', K.holders), seats_total(), 0, now, {})
end
