--[[
  due_settle: files the due times the reaper found for licenses it claimed
  (due_claim.lua) in one shard of the due index.

  KEYS[1]  the due index shard
  ARGV[1]  the marker the licenses were claimed with
  ARGV[2..] license, due pairs: each license's next due time (ms) as reap.lua
           reported it after its last step, 0 for never

  A license still carrying the marker (nobody filed a due time meanwhile)
  gets its due time, or leaves the index when it has none. One whose mark is
  gone had an earlier time filed by a worker (ZADD LT) while it was reaped,
  or was claimed again by another pass after this one's claim ran out: the
  earlier of the two times stays, so nothing filed is lost.

  Returns how many licenses left the index.
]]
local rcall = redis.call
local key = KEYS[1]
local marker = tonumber(ARGV[1])
local removed = 0
for i = 2, #ARGV - 1, 2 do
  local license, due = ARGV[i], tonumber(ARGV[i + 1])
  local score = rcall('ZSCORE', key, license)
  if score and tonumber(score) == marker then
    if due > 0 then
      rcall('ZADD', key, due, license)
    else
      removed = removed + rcall('ZREM', key, license)
    end
  elseif due > 0 then
    rcall('ZADD', key, 'LT', due, license)
  end
end
return removed
