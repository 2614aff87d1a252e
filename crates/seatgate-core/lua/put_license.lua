--[[
  put_license: write a change to a license record only if the record is
  still what the writer read: a compare-and-set, so that a change validated
  in Rust (engine::license::change, the one home of the record's rules and
  of the policies' fit) is never applied on top of a record another writer
  changed in between (a billing system's HSET, a second `license put`).
  The writer reads the record, merges and validates, and calls this; on 0
  it reads again and re-decides.

  KEYS[1]  seat:{L}:license, the record (HASH); the only key, so cluster-safe
  ARGV[1]  n: the number of fields the record had when read
  ARGV[2 .. 2n+1]      those fields and their values, pairwise
  ARGV[2n+2]           m: the number of fields to write
  ARGV[2n+3 .. 2n+2m+2] those fields and their values, pairwise
  ARGV[2n+2m+3 ..]     the fields to remove

  Returns 1 when the change was written, 0 when the record is no longer what
  was read (nothing written).
  Emits no events.
]]
local rcall = redis.call
local key = KEYS[1]
local n = tonumber(ARGV[1])
if rcall('HLEN', key) ~= n then
  return 0
end
if n > 0 then
  local names = {}
  for i = 1, n do
    names[i] = ARGV[2 * i]
  end
  local now = rcall('HMGET', key, unpack(names))
  for i = 1, n do
    if now[i] ~= ARGV[2 * i + 1] then
      return 0
    end
  end
end
local at = 2 * n + 2
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
return 1
