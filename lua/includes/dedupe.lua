--[[
  dedupe: the reply each stream entry got, in KEYS[9] (done:<bucket>), so a
  redelivered entry gets it again and changes nothing.

  The dedupe record, the value of field <entry id>: the common case (no
  notes) as "status|used|total|detail|now", cheaper to write than JSON; an
  outcome with notes as its JSON array.
]]
--- @include "keys"
--- @include "outcome"

-- The outcome stored for `entry_id`, marked changed = 0 and replayed = 1 so
-- the worker re-sends it (and re-delivers its notes) but publishes no second
-- event; nil when the entry was not decided before.
local function replay(entry_id)
  if entry_id == '' then
    return nil
  end
  local raw = rcall('HGET', K.done, entry_id)
  if not raw then
    return nil
  end
  local r
  if string.sub(raw, 1, 1) == '[' then
    r = cjson.decode(raw)
  else
    local status, used, total, detail, now = string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
    r = {status, tonumber(used), tonumber(total), tonumber(detail) or detail, tonumber(now), {}}
  end
  return {r[1], r[2], r[3], r[4], r[5], r[6], 0, 1}
end

-- Remembers outcome `result` for `entry_id` until `expire_at` (unix ms) and
-- returns it.
local function remember(entry_id, expire_at, result)
  if entry_id ~= '' then
    local encoded
    if #result[6] == 0 then
      encoded = result[1] .. '|' .. result[2] .. '|' .. result[3] .. '|' .. result[4] .. '|' .. result[5]
    else
      encoded = cjson.encode({result[1], result[2], result[3], result[4], result[5], result[6]})
    end
    rcall('HSET', K.done, entry_id, encoded)
    rcall('PEXPIREAT', K.done, expire_at)
  end
  return result
end
