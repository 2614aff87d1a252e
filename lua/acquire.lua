--[[
  acquire: give `session` one seat of the license, atomically.

  KEYS[1]  seat:{L}:license   HASH  seats_total, expires_at_ms, active, ...
  KEYS[2]  seat:{L}:holders   ZSET  session -> last heartbeat (ms, server clock)
  KEYS[3]  seat:{L}:sessions  HASH  session -> "<acquired_at>:<heartbeats>:<meta>"

  ARGV[1]  session id (validated by the worker: [A-Za-z0-9._:@-]{1,128})
  ARGV[2]  metadata, a JSON object (validated by the worker)

  Returns {status, seats_used, seats_total}; status is one of
    ACQUIRED            seat taken, heartbeat clock started
    ALREADY_ACTIVE      the session already holds a seat; nothing changed
    NO_SEATS_AVAILABLE  every seat is held (or seats_total was lowered)
    LICENSE_NOT_FOUND | LICENSE_INACTIVE | LICENSE_EXPIRED
  The license check runs inside this script, so a change of seats_total,
  expiry or `active` can never race with an acquire.
]]
local license_key, holders_key, sessions_key = KEYS[1], KEYS[2], KEYS[3]
local session, meta = ARGV[1], ARGV[2]

local now = now_ms()
local refusal, total = check_license(license_key, now)
local used = rcall('ZCARD', holders_key)

-- A retried acquire gets the answer the first one got, whatever happened to
-- the license since: the session holds its seat until it releases or is reaped.
if rcall('ZSCORE', holders_key, session) then
  return {'ALREADY_ACTIVE', used, total}
end

if refusal then
  return {refusal, used, total}
end

if used >= total then
  return {'NO_SEATS_AVAILABLE', used, total}
end

rcall('ZADD', holders_key, now, session)
rcall('HSET', sessions_key, session, now .. ':0:' .. meta)
return {'ACQUIRED', used + 1, total}
