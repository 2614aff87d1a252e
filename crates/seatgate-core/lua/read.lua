--[[
  read: one page of a requests stream for a consumer of its group, with
  every entry over the entry limits cut down to a stub, so that a worker
  never receives more of an entry than the limits allow, however many
  fields a client put in it (issue 35, M3). Redis holds the entry already;
  the stub is what crosses the network and sits in the worker's memory.

  KEYS[1]  the requests stream
  ARGV[1]  the group
  ARGV[2]  the consumer
  ARGV[3]  COUNT
  ARGV[4]  limits.max_entry_bytes: the most bytes of field names and values
  ARGV[5]  the most fields an entry may have
  ARGV[6]  what to read: 'new' (XREADGROUP >), 'pending' (XREADGROUP 0, this
           consumer's own) or 'claim' (XAUTOCLAIM)
  ARGV[7]  (claim) the least idle time, ms
  ARGV[8]  (claim) the cursor

  Returns the stream's entries as XREADGROUP lists them (each an id and
  its fields and values, alternating; an entry deleted while pending with
  nil for its fields), or for 'claim' what XAUTOCLAIM returns (the next
  cursor, the entries, the ids deleted while pending). An entry over the
  limits comes with the fields 'seatgate.oversize' = '<fields> <bytes>'
  (its size as stored) and then its last `id`, `reply_to`, `op`, `license`
  and `session` of at most 256 bytes each (MAX_REPLY_TO_LEN), so that the
  worker can still answer it (crate::request, `check_sizes`).
]]
local rcall = redis.call
local stream, group, consumer, count = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local max_bytes, max_fields, what = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]

local SALVAGED_ORDER = { 'id', 'reply_to', 'op', 'license', 'session' }
local SALVAGED = { id = true, reply_to = true, op = true, license = true, session = true }
local SALVAGED_LEN = 256

local function bounded(entry)
  local flat = entry[2]
  if type(flat) ~= 'table' then
    return entry
  end
  local bytes = 0
  for i = 1, #flat do
    bytes = bytes + #flat[i]
  end
  local fields = math.floor(#flat / 2)
  if bytes <= max_bytes and fields <= max_fields then
    return entry
  end
  -- The last short value of each, as the worker reads a repeated field.
  local kept = {}
  for i = 1, #flat - 1, 2 do
    local name, value = flat[i], flat[i + 1]
    if SALVAGED[name] and #value <= SALVAGED_LEN then
      kept[name] = value
    end
  end
  local stub = { 'seatgate.oversize', fields .. ' ' .. bytes }
  for _, name in ipairs(SALVAGED_ORDER) do
    if kept[name] then
      stub[#stub + 1] = name
      stub[#stub + 1] = kept[name]
    end
  end
  return { entry[1], stub }
end

local function bounded_all(entries)
  if type(entries) ~= 'table' then
    return {}
  end
  for i = 1, #entries do
    entries[i] = bounded(entries[i])
  end
  return entries
end

if what == 'claim' then
  local reply = rcall('XAUTOCLAIM', stream, group, consumer, ARGV[7], ARGV[8], 'COUNT', count)
  reply[2] = bounded_all(reply[2])
  return reply
end
local id = '>'
if what == 'pending' then
  id = '0'
end
local reply = rcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count, 'STREAMS', stream, id)
if type(reply) ~= 'table' or type(reply[1]) ~= 'table' then
  return {}
end
return bounded_all(reply[1][2])
