--[[
  session_record: the value of a holder in K.sessions, the one place
  it is built and parsed in Lua. Rust reads it with
  engine::records::SessionRecord (seatgate status).

    "<acquired_at_ms>:<heartbeats>:<meta>"               no lease
    "<acquired_at_ms>:<heartbeats>:<lease_hash>:<meta>"  bound to a lease
      acquired_at_ms  when the seat was taken or granted (Redis clock)
      heartbeats      heartbeats counted since
      lease_hash      16 lowercase hex digits, the hash of the lease the seat
                      is bound to (lease.lua); absent when it is bound to none
      meta            the caller's metadata JSON object, as sent; it may
                      contain colons, so split on the first two (or three)
                      only. It always starts with '{', never with a hex
                      digit, so the two forms cannot be confused.

  A plain string rather than JSON: a ~60-byte metadata record stays small
  enough for the hash's listpack encoding, and a heartbeat bumps the count
  without decoding the metadata. A lease adds 17 bytes; a record written
  before leases existed reads as bound to none.

  Every member of holders (lingering and borrowed seats too) has its record
  here: the script that adds one writes the other, and whatever removes a
  holder removes its record. So a session without a record holds no seat,
  which acquire relies on to skip looking in holders (seat_lease.lua).
]]
--- @include "keys"
--- @include "clock"
--- @include "encoding"

-- A bound record's rest: its lease hash (16 hex digits) and its meta
-- (written out: the library's builtins do not exist while it loads).
local LEASE_AND_META = '^(%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x):(.*)$'

local function encode_session_record(acquired_at, heartbeats, lease, meta)
  -- A time Lua holds as a number is written with '%d' (clock.lua's ms;
  -- Lua's own '%.14g' is several times slower); one read back from a
  -- record stays its digits.
  if type(acquired_at) == 'number' then
    acquired_at = ms(acquired_at)
  end
  if lease == '' then
    return string.format('%s:%d:%s', acquired_at, heartbeats, meta)
  end
  return string.format('%s:%d:%s:%s', acquired_at, heartbeats, lease, meta)
end

-- Returns acquired_at (digits, as stored), heartbeats (number), the lease
-- hash ('' for none) and meta, or nil for a record that is not of this form.
local function parse_session_record(record)
  local acquired_at, heartbeats, rest = string.match(record, '^(%d+):(%d+):(.*)$')
  if not acquired_at then
    return nil
  end
  local lease, meta = string.match(rest, LEASE_AND_META)
  if not lease then
    lease, meta = '', rest
  end
  return acquired_at, tonumber(heartbeats), lease, meta
end

-- The lease hash `session`'s seat is bound to: '' for none (or a record not
-- of this form), nil when it holds no record; then, for a record of this
-- form, the rest of what it holds (parse_session_record: acquired_at,
-- heartbeats, meta), so a caller that goes on to rewrite it (heartbeat)
-- need not read it again.
local function holder_lease(session)
  local record = rcall('HGET', K.sessions, session)
  if not record then
    return nil
  end
  local acquired_at, heartbeats, lease, meta = parse_session_record(record)
  return lease or '', acquired_at, heartbeats, meta
end

-- Records that `session` took a seat at `now`, with no heartbeat yet, bound
-- to lease hash `lease` ('' = none).
local function start_session(session, now, meta, lease)
  rcall('HSET', K.sessions, session, encode_session_record(now, 0, lease, meta))
end

-- Every this many seats in use, a seat given checks that the license's
-- holders, sessions and owners are in Redis's hashed encodings
-- (encoding.lua). A request looks its session up in holders and sessions
-- (a new one misses, reading them whole while they are listpacks):
-- measured with ops/callgrind.sh on ops/redis.conf's settings, 100 holders
-- added 49 thousand instructions to a direct acquire + release and 71 to a
-- heartbeat, 400 holders 90 and 84; at 10 holders a heartbeat still costs
-- about 10 thousand more than hashed, the price of the compact memory
-- below HASHED_EVERY (docs/performance.md has the bytes a holder). A key
-- made again after it emptied is a listpack until the count passes a
-- multiple again; a license whose keys were listpacks before this is
-- checked at its next multiple.
local HASHED_EVERY = 32

-- Gives `session` a seat at `now` (its place in holders and its session
-- record, as start_session); `used`: the seats in use with it.
local function hold(session, now, meta, lease, used)
  rcall('ZADD', K.holders, ms(now), session)
  local record = encode_session_record(now, 0, lease, meta)
  if used % HASHED_EVERY ~= 0 then
    rcall('HSET', K.sessions, session, record)
    return
  end
  if is_listpack(K.holders) then
    zset_as_skiplist(K.holders)
  end
  if is_listpack(K.sessions) then
    hset_as_hashtable(K.sessions, session, record)
  else
    rcall('HSET', K.sessions, session, record)
  end
  -- The owner records and counts of a license whose holders name users or
  -- groups (owners.lua), two fields or more a holder.
  if is_listpack(K.owners) then
    hash_as_hashtable(K.owners)
  end
end
