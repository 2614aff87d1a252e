--[[
  due_claim: takes the next licenses due for the reaper off one shard of the
  due index (src/runtime/due.rs), marking each claimed by this pass.

  KEYS[1]  the shard's stale index, ZSET license -> when its oldest holder
           goes stale (ms)
  KEYS[2]  the shard's due index, ZSET license -> when it next has other
           work (ms)
           (both share the shard's hash tag; in either, a claimed license
           scores the claim base + its claim's end)
  ARGV[1]  now: the pass's Redis clock (ms); licenses due before it are taken
  ARGV[2]  the most licenses to take
  ARGV[3]  the claim's end (ms): a pass that dies leaves its licenses claimed,
           and from then on any pass takes them again
  ARGV[4]  the claim base, above every time there can be

  Returns {marker, license, ...}: the score the taken licenses now carry
  (in each index that holds them, due there or not, so due_settle.lua may
  remove what the reaper finds gone), then the licenses, each once, those
  whose earlier claim ran out first.

  Why a mark: every time a worker files lies below the claim base, so a time
  filed while the license is being reaped replaces the mark, and
  due_settle.lua then keeps the earlier of that and its own rather than
  lose it.

  Each pass also keeps both indexes skiplists (encoding.lua): the workers
  file a license's time in the stale index on every acquire, and in a
  listpack (a shard's index of up to 128 licenses) each such ZADD searches
  and rewrites it entry by entry. Index members are license ids, never the
  long member encoding.lua adds and takes out.
]]
local rcall = redis.call
--- @include "encoding"
local now, limit, claim_end, base = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local marker = base + claim_end

-- The marker goes to Redis as this string: a Lua number would be written
-- with '%.17g' for every ZADD.
local out, taken = {string.format('%d', marker)}, {}
local function take(key, min, max)
  local room = limit - (#out - 1)
  if room <= 0 then
    return
  end
  for _, license in ipairs(rcall('ZRANGEBYSCORE', key, min, max, 'LIMIT', 0, room)) do
    if not taken[license] then
      taken[license] = true
      out[#out + 1] = license
    end
  end
end
for _, key in ipairs(KEYS) do
  take(key, base, '(' .. (base + now))
end
for _, key in ipairs(KEYS) do
  take(key, '-inf', '(' .. now)
end
for i = 2, #out do
  for _, key in ipairs(KEYS) do
    rcall('ZADD', key, 'XX', out[1], out[i])
  end
end
for _, key in ipairs(KEYS) do
  if is_listpack(key) then
    zset_as_skiplist(key)
  end
end
return out
