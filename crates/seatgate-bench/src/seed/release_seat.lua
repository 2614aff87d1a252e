--[[
  release_seat: the seed design ADR's seat release (its
  "release_seat.lua"), the benchmark's yardstick beside acquire_seat.lua.
  Bench only; seatgate never runs it.

  The one change from the ADR, as in acquire_seat.lua: both keys come in
  KEYS (with the license's hash tag) instead of being built in the script,
  so that it runs on Redis Cluster. The logic is the ADR's.

  KEYS[1]  SET: the license's active session ids
  KEYS[2]  HASH: session id -> JSON metadata
  ARGV[1]  session id

  Returns
    {1, 'RELEASED', seats_used}   the seat is free
    {0, 'SESSION_NOT_FOUND'}      the session held no seat
  Emits no events.
]]
local active_sessions_key = KEYS[1]
local session_metadata_key = KEYS[2]
local session_id = ARGV[1]

if redis.call('SISMEMBER', active_sessions_key, session_id) == 0 then
  return {0, 'SESSION_NOT_FOUND'}
end

redis.call('SREM', active_sessions_key, session_id)
redis.call('HDEL', session_metadata_key, session_id)

local new_count = redis.call('SCARD', active_sessions_key)
return {1, 'RELEASED', new_count}
