--[[
  put_license: write a change to a license record only if the record is
  still what the writer read: a compare-and-set, so that a change validated
  in Rust (engine::license::change, the one home of the record's rules and
  of the policies' fit) is never applied on top of a record another writer
  changed in between (a billing system's HSET, a second `license put`).
  The writer reads the record, merges and validates, and calls this; on 0
  it reads again and re-decides. The change and its `license_put` event
  (includes/admin.lua) are one atomic step: no change lands without it.

  KEYS[1]  seat:{L}:license, the record (HASH); its other keys derived
           (includes/keys.lua), all in its slot
  KEYS[2]  where its events go (includes/events.lua)
  ARGV[1]  the license id, ARGV[2] the events retention, ms (events.lua)
  ARGV[3]  the actor; ARGV[4], ARGV[5] the event's `before` and `after`
           (JSON objects of the fields changed, as the writer computed
           them from what it read: the compare-and-set makes them true)
  ARGV[6]  n: the number of fields the record had when read
  ARGV[7 .. 2n+6]      those fields and their values, pairwise
  ARGV[2n+7]           m: the number of fields to write
  ARGV[2n+8 .. 2n+2m+7] those fields and their values, pairwise
  ARGV[2n+2m+8 ..]     the fields to remove

  Returns 1 when the change was written, 0 when the record is no longer what
  was read (nothing written, no event).
  Records one `license_put` event (includes/admin.lua) when it writes.
]]
local rcall = redis.call
--- @include "keys"
--- @include "clock"
--- @include "admin"

local BASE = 5
local key = K.license
local n = tonumber(ARGV[BASE + 1])
if rcall('HLEN', key) ~= n then
  return 0
end
if n > 0 then
  local names = {}
  for i = 1, n do
    names[i] = ARGV[BASE + 2 * i]
  end
  local now = rcall('HMGET', key, unpack(names))
  for i = 1, n do
    if now[i] ~= ARGV[BASE + 2 * i + 1] then
      return 0
    end
  end
end
local at = BASE + 2 * n + 2
local m = tonumber(ARGV[at])
local removed = {}
for i = at + 2 * m + 1, #ARGV do
  removed[#removed + 1] = ARGV[i]
end
if #removed > 0 then
  rcall('HDEL', key, unpack(removed))
end
if m > 0 then
  local set = {}
  for i = at + 1, at + 2 * m do
    set[#set + 1] = ARGV[i]
  end
  rcall('HSET', key, unpack(set))
end
EV.license, EV.keep_ms = ARGV[1], tonumber(ARGV[2])
admin_event('license_put', ARGV[3], ARGV[4], ARGV[5], now_ms())
return 1
