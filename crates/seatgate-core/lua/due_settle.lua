--[[
  due_settle: files the times the reaper found for the licenses it claimed
  (due_claim.lua) in one shard of the due index.

  KEYS[1]  the shard's stale index
  KEYS[2]  the shard's due index
  ARGV[1]  the marker the licenses were claimed with
  ARGV[2..] license, stale, due triples: each license's times as reap.lua
           reported them after its last step (ms), 0 for none

  In each index, a license still carrying the marker (nobody filed a time
  meanwhile) gets its new time, or leaves the index when it has none. One
  whose mark is gone had a time filed by a worker while it was reaped (or
  was claimed again by another pass once this one's claim ran out), and one
  not claimed in that index may hold an earlier time: the earlier of the
  two stays, so nothing filed is lost.

  Returns how many entries left the indexes.
]]
local rcall = redis.call
local marker = tonumber(ARGV[1])
local removed = 0

-- `at` is the time as the reaper sent it: handed to ZADD as that string,
-- not as a Lua number, which would be written with '%.17g'.
local function file(key, license, at)
  local filed = tonumber(at) > 0
  local score = rcall('ZSCORE', key, license)
  if score and tonumber(score) == marker then
    if filed then
      rcall('ZADD', key, at, license)
    else
      removed = removed + rcall('ZREM', key, license)
    end
  elseif filed then
    rcall('ZADD', key, 'LT', at, license)
  end
end

for i = 2, #ARGV - 2, 3 do
  local license = ARGV[i]
  file(KEYS[1], license, ARGV[i + 1])
  file(KEYS[2], license, ARGV[i + 2])
end
return removed
