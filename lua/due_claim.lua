--[[
  due_claim: takes the next licenses due for the reaper off one shard of the
  due index (src/runtime/due.rs), marking each claimed by this pass.

  KEYS[1]  a due index shard, ZSET license -> due time (ms); a claimed
           license scores the claim base + its claim's end
  ARGV[1]  now: the pass's Redis clock (ms); licenses due before it are taken
  ARGV[2]  the most licenses to take
  ARGV[3]  the claim's end (ms): a pass that dies leaves its licenses claimed,
           and from then on any pass takes them again
  ARGV[4]  the claim base, above every due time there can be

  Returns {marker, license, ...}: the score the taken licenses now carry,
  then the licenses, those whose earlier claim ran out first.

  Why a mark: the worker files a due time with ZADD LT (it only ever
  lowers), and every due time lies below the claim base, so a due time filed
  while the license is being reaped always replaces the mark. due_settle.lua
  then sees that and keeps the earlier time rather than lose it.
]]
local rcall = redis.call
local key = KEYS[1]
local now, limit, claim_end, base = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local marker = base + claim_end

local taken = rcall('ZRANGEBYSCORE', key, base, '(' .. (base + now), 'LIMIT', 0, limit)
if #taken < limit then
  local due = rcall('ZRANGEBYSCORE', key, '-inf', '(' .. now, 'LIMIT', 0, limit - #taken)
  for _, license in ipairs(due) do
    taken[#taken + 1] = license
  end
end
local out = {string.format('%d', marker)}
for _, license in ipairs(taken) do
  rcall('ZADD', key, 'XX', marker, license)
  out[#out + 1] = license
end
return out
