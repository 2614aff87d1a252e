--[[
  admin: the admin trail, an event per administrator's change of a license
  (its record, `license put`; its group map, `license groups`), recorded by
  the script that makes the change, in the same atomic step, into the
  license's events like a seat event (events.lua: the same `seq`, the same
  shard or, on a cluster, the license's own log). docs/protocol.md,
  "Events", lists the types; src/events.rs reads them.

  An admin event has no session (''): its extra fields are
    actor   who made the change (the CLI's --actor, SEATGATE_ACTOR or OS user)
    before  the fields the change touched, as they were: a JSON object of
            strings, `{}` for none (a license created)
    after   the same fields as they are now (a field absent was removed)
  and the seats of the license after the change (seats_used, its holders;
  seats_total, its record's, 0 without one).
]]
--- @include "keys"
--- @include "clock"
--- @include "license"
--- @include "events"

-- `flat` (HGETALL's field, value list) as a JSON object of strings, its
-- fields in name order: the same record always reads the same (cjson's
-- order of a table's keys is no order).
local function record_json(flat)
  local names, values = {}, {}
  for i = 1, #flat, 2 do
    names[#names + 1] = flat[i]
    values[flat[i]] = flat[i + 1]
  end
  table.sort(names)
  local parts = {}
  for i, name in ipairs(names) do
    parts[i] = cjson.encode(name) .. ':' .. cjson.encode(values[name])
  end
  return '{' .. table.concat(parts, ',') .. '}'
end

-- Records admin event `kind` by `actor` with `before` and `after` (JSON
-- text, as the caller encoded them) at `now`, now (not queued).
local function admin_event(kind, actor, before, after, now)
  local used = rcall('ZCARD', K.holders)
  append_event(kind, '', {'actor', actor, 'before', before, 'after', after}, ms(used), ms(seats_total()),
    now, ms(now))
end
