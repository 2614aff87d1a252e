--[[
  prologue: what acquire, release, heartbeat and revoke do before deciding.
  They take KEYS[1..17] (keys.lua) and share their first seven ARGV:
    ARGV[1]  stream entry id of the request ('' = no dedupe)
    ARGV[2]  unix ms at which KEYS[12] may expire (two windows after its
             bucket starts; dedupe.lua caps it at now + 2 x ARGV[7])
    ARGV[3]  most requests per session per window (0 = no limit)
    ARGV[4]  most requests per license per window (0 = no limit)
    ARGV[5]  rate window, ms
    ARGV[6]  '1' to look for the reply the entry got before (the worker always
             asks: even a first delivery may have been decided by a worker that
             stalled past claim_idle_ms and had its batch claimed); '0' skips it
    ARGV[7]  dedupe window, ms
  Their own arguments start at ARGV[8]: the session, then its lease ('' =
  none), then the op's own, and last the service's heartbeat timeout (ms),
  which due_report (due.lua) takes to fill in the outcome's last slots.
]]
--- @include "keys"
--- @include "license"
--- @include "outcome"
--- @include "dedupe"
--- @include "rate_limit"

-- A replayed outcome, or LEASE_MISMATCH, or RATE_LIMITED, or nil to go on
-- deciding. `limited` says whether this op is rate limited at all (release
-- is not: giving a seat back always works; nor is an administrator's
-- revoke). `refuse`, when given, is called as refuse(session, lease, now)
-- with the script's session and lease hash, and returns its LEASE_MISMATCH
-- outcome or nil (a helper passed as it is: a function made for the call
-- would cost a closure on every run): it runs before the rate limits and a refusal is not counted in
-- them, so a caller without the lease cannot use up the holder's budget and
-- get its heartbeats refused. (Revoke passes none: it is the
-- administrator's way around a lease.)
local function prologue(now, limited, refuse, session, lease)
  local entry_id = ARGV[1]
  if ARGV[6] == '1' then
    local previous = replay(entry_id, now)
    if previous then
      return previous
    end
  end
  local refusal = refuse and refuse(session, lease, now)
  if refusal then
    return remember(entry_id, ARGV[2], tonumber(ARGV[7]), refusal)
  end
  if limited and rate_limited(now, tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])) then
    return remember(entry_id, ARGV[2], tonumber(ARGV[7]),
      outcome('RATE_LIMITED', rcall('ZCARD', K.holders), seats_total(), 0, now, {}))
  end
  return nil
end

-- Stores the decided outcome for this request's entry and returns it.
local function settle(result)
  return remember(ARGV[1], ARGV[2], tonumber(ARGV[7]), result)
end
