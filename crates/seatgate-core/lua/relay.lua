--[[
  relay: appends a license's events from its own log (seat:{L}:events, on
  a Redis Cluster: lua/includes/events.lua) to its events shard, each
  exactly once, however often the same entries are relayed (a relay that
  died before deleting what it relayed, two relays at once).

  KEYS[1]  the events shard (seat:events, or seat:events:{i})
  KEYS[2]  the shard's relay cursors, a HASH on the shard's slot:
           license -> the seq of its last event appended to the shard
  ARGV[1]  the license id
  ARGV[2]  the events retention, ms: the shard is trimmed (MINID ~ <now -
           retention>) once per call that appends anything
  ARGV[3..] the log's entries, oldest first, each as
           <seq> <n> <field 1> <value 1> ... <field n> <value n>
  An entry whose seq is not above the cursor was appended before: skipped.
  Returns the cursor afterwards: the caller deletes the log's entries up to
  it (their seq no higher), which are on the shard now.
]]
local rcall = redis.call
local license, keep_ms = ARGV[1], tonumber(ARGV[2])
local cursor = tonumber(rcall('HGET', KEYS[2], license) or '0')
local last = cursor
local i = 3
while i <= #ARGV do
  local seq, n = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if seq > last then
    local args = {KEYS[1]}
    if last == cursor and keep_ms > 0 then
      local t = rcall('TIME')
      local oldest = tonumber(t[1]) * 1000 - keep_ms
      if oldest > 0 then
        args[2], args[3], args[4] = 'MINID', '~', string.format('%d', oldest)
      end
    end
    args[#args + 1] = '*'
    for j = i + 2, i + 1 + 2 * n do
      args[#args + 1] = ARGV[j]
    end
    rcall('XADD', unpack(args))
    last = seq
  end
  i = i + 2 + 2 * n
end
if last > cursor then
  rcall('HSET', KEYS[2], license, string.format('%d', last))
end
return last
