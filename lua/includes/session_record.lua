--[[
  session_record: the value of a holder in KEYS[3] (sessions), the one place
  it is built and parsed in Lua. Rust reads it with
  engine::records::SessionRecord (seatgate status).

    "<acquired_at_ms>:<heartbeats>:<meta>"
      acquired_at_ms  when the seat was taken or granted (Redis clock)
      heartbeats      heartbeats counted since
      meta            the caller's metadata JSON object, as sent; it may
                      contain colons, so split on the first two only

  A plain string rather than JSON: a ~60-byte metadata record stays small
  enough for the hash's listpack encoding, and a heartbeat bumps the count
  without decoding the metadata.
]]
--- @include "keys"

local function encode_session_record(acquired_at, heartbeats, meta)
  return acquired_at .. ':' .. heartbeats .. ':' .. meta
end

-- Returns acquired_at (digits, as stored), heartbeats (number) and meta, or
-- nil for a record that is not of this form.
local function parse_session_record(record)
  local acquired_at, heartbeats, meta = string.match(record, '^(%d+):(%d+):(.*)$')
  if not acquired_at then
    return nil
  end
  return acquired_at, tonumber(heartbeats), meta
end

-- Records that `session` took a seat at `now`, with no heartbeat yet.
local function start_session(session, now, meta)
  rcall('HSET', K.sessions, session, encode_session_record(now, 0, meta))
end

-- Counts one heartbeat of `session` at `now`. Returns the new count.
local function count_heartbeat(session, now)
  local acquired_at, beats, meta
  local record = rcall('HGET', K.sessions, session)
  if record then
    acquired_at, beats, meta = parse_session_record(record)
  end
  if not acquired_at then
    -- A missing or foreign record: start a fresh one rather than lose the count.
    acquired_at, beats, meta = now, 0, '{}'
  end
  rcall('HSET', K.sessions, session, encode_session_record(acquired_at, beats + 1, meta))
  return beats + 1
end
