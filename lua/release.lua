--[[
  release: free the seat that `session` holds. Only the holder's own session
  id releases it; nothing else is touched.

  KEYS[1]  seat:{L}:license   HASH
  KEYS[2]  seat:{L}:holders   ZSET  session -> last heartbeat (ms)
  KEYS[3]  seat:{L}:sessions  HASH  session -> session record

  ARGV[1]  session id

  Returns {status, seats_used, seats_total}; status is one of
    RELEASED           the seat is free again
    SESSION_NOT_FOUND  the session holds no seat; nothing changed
  Release works whatever the license's state: a user can always give a seat back.
]]
local license_key, holders_key, sessions_key = KEYS[1], KEYS[2], KEYS[3]
local session = ARGV[1]

local total = seats_total(license_key)
if rcall('ZREM', holders_key, session) == 0 then
  return {'SESSION_NOT_FOUND', rcall('ZCARD', holders_key), total}
end
rcall('HDEL', sessions_key, session)
return {'RELEASED', rcall('ZCARD', holders_key), total}
