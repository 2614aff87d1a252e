--[[
  acquire_seat: the seed design ADR's seat acquisition (its
  "acquire_seat.lua"), kept as the benchmark's yardstick of the least Redis
  work a correct seat decision needs. Bench only; seatgate never runs it.

  The one change from the ADR: the ADR built its key names inside the
  script from a license id, which Redis Cluster refuses (a script may touch
  only the keys it is given, all in one slot). Here the caller passes both
  keys; they carry the license's hash tag. The logic is the ADR's.

  KEYS[1]  SET: the license's active session ids
  KEYS[2]  HASH: session id -> JSON metadata (acquired_at, last_heartbeat, ...)
  ARGV[1]  session id
  ARGV[2]  seats_total (max allowed seats)
  ARGV[3]  session metadata, a JSON object (user_email, hardware_id, ...)

  Returns
    {1, 'ACQUIRED', seats_used, seats_total}            the seat is taken
    {1, 'ALREADY_ACTIVE', seats_used}                   the session held one already
    {0, 'NO_SEATS_AVAILABLE', seats_used, seats_total}  every seat is taken
  Emits no events.
]]
local active_sessions_key = KEYS[1]
local session_metadata_key = KEYS[2]
local session_id = ARGV[1]
local seats_total = tonumber(ARGV[2])
local session_metadata = ARGV[3]

if redis.call('SISMEMBER', active_sessions_key, session_id) == 1 then
  local current_count = redis.call('SCARD', active_sessions_key)
  return {1, 'ALREADY_ACTIVE', current_count}
end

local seats_used = redis.call('SCARD', active_sessions_key)
if seats_used >= seats_total then
  return {0, 'NO_SEATS_AVAILABLE', seats_used, seats_total}
end

redis.call('SADD', active_sessions_key, session_id)

local timestamp = redis.call('TIME')[1]
local metadata_with_timestamp = cjson.decode(session_metadata)
metadata_with_timestamp['acquired_at'] = tonumber(timestamp)
metadata_with_timestamp['last_heartbeat'] = tonumber(timestamp)
redis.call('HSET', session_metadata_key, session_id, cjson.encode(metadata_with_timestamp))

local new_count = redis.call('SCARD', active_sessions_key)
return {1, 'ACQUIRED', new_count, seats_total}
