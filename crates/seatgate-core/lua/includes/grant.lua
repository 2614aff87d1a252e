--[[
  grant: a seat freed by release, revoke or the reaper goes to the queue,
  but only while the license may hand out seats: never from a record that
  breaks its rules (license.lua), nor from one whose policy fields break
  theirs (policy.lua), nor from an inactive or expired one. Acquire decides
  its own grants (it refuses an invalid record before anything else).
]]
--- @include "keys"
--- @include "license"
--- @include "policy"

-- Hands free seats to the queue, at most `limit`, when license state
-- `license` (license_state) and its policy fields allow it. `P` and
-- `invalid` are what policy().read() returned, when the caller read them
-- already (release, for linger_ms); else they are read here when the
-- license has policies on. Returns the seats in use afterwards and the
-- grants made (grant_waiters, policy.lua).
local function grant_if_valid(license, now, notes, limit, P, invalid)
  if license.policy and not (P or invalid or license.refusal) then
    P, invalid = policy().read(license.record)
  end
  if license.refusal or invalid then
    return rcall('ZCARD', K.holders), 0
  end
  return grant_waiters(now, license.total, notes, limit, P)
end
