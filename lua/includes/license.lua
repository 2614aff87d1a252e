--[[
  license: reading the license record, KEYS[1] (keys.lua), under its rules.

  The rules, checked in this order (their Rust home is src/engine/license.rs,
  StoredRecord::validate; tests/it/lease.rs runs both on the same values):
    seats_total           digits, 0 to 1000000 (absent: there is no license)
    expires_at_ms         digits, 0 to 999999999999999 (absent or 0: never)
    active                0 or 1 (absent: active)
    heartbeat_timeout_ms  digits, 1 to 999999999999999 (absent: the default)
    queue_max             digits, 1 to 999999999999999 (absent: the default)
    policy                0 or 1 (absent: 0); 1 switches the policy fields
                          on, checked (by policy.lua, with license_number)
                          only then, after the fields above:
    max_per_user          digits, 0 to 999999999999999
    max_priority          digits, 0 to 9
    linger_ms             digits, 0 to 999999999999999
    max_borrow_ms         digits, 0 to 31536000000 (a year)
    group_max:<g>         digits, 0 to 1000000, in field name order, and
    group_reserve:<g>     <g> an id like a session's
  Digits only: tonumber alone would take "0x10", " 5", "1e3", "inf" and
  "nan", and a record read that way fails open (5.5 seats hand out 6, inf is
  unlimited, an expiry that is no number never comes). A record that breaks a
  rule hands out no seat: acquires get LICENSE_INVALID naming the field.
  Fifteen digits stay below 2^53, so every allowed value is an exact number.
]]
--- @include "keys"

local LICENSE_FIELDS = {'seats_total', 'expires_at_ms', 'active', 'heartbeat_timeout_ms', 'queue_max', 'policy'}
-- Per field: smallest value, largest value, most digits.
local LICENSE_RULES = {
  seats_total = {0, 1000000, 7},
  expires_at_ms = {0, 999999999999999, 15},
  active = {0, 1, 1},
  heartbeat_timeout_ms = {1, 999999999999999, 15},
  queue_max = {1, 999999999999999, 15},
  policy = {0, 1, 1},
}

-- The number `raw` stands for under `field`'s rule; nil when it breaks it.
local function license_number(field, raw)
  local rule = LICENSE_RULES[field]
  if #raw > rule[3] or not string.find(raw, '^%d+$') then
    return nil
  end
  local n = tonumber(raw)
  if n < rule[1] or n > rule[2] then
    return nil
  end
  return n
end

-- The license's seat count: 0 when there is no record or its seats_total
-- breaks the rule.
local function seats_total()
  local raw = rcall('HGET', K.license, 'seats_total')
  return raw and license_number('seats_total', raw) or 0
end

-- Reads the license record and decides whether it may hand out seats now.
-- Returns a table:
--   refusal   nil, or LICENSE_NOT_FOUND | LICENSE_INVALID | LICENSE_INACTIVE | LICENSE_EXPIRED
--   total     seats_total (0 when absent or invalid)
--   invalid   for LICENSE_INVALID, {field, value} of the first field that
--             breaks its rule (the value cut to 64 bytes): the outcome's detail
--   heartbeat_timeout_ms, queue_max   the record's, when present and valid
--   policy    whether the policy fields are on (policy.lua reads them)
local function license_state(now)
  local raw = rcall('HMGET', K.license, unpack(LICENSE_FIELDS))
  local rec = {}
  local invalid
  for i, field in ipairs(LICENSE_FIELDS) do
    local value = raw[i]
    if value then
      rec[field] = license_number(field, value)
      if rec[field] == nil and not invalid then
        invalid = {field, string.sub(value, 1, 64)}
      end
    end
  end
  local state = {
    total = rec.seats_total or 0,
    heartbeat_timeout_ms = rec.heartbeat_timeout_ms,
    queue_max = rec.queue_max,
    policy = rec.policy == 1,
  }
  if not raw[1] then
    state.refusal = 'LICENSE_NOT_FOUND'
  elseif invalid then
    state.refusal, state.invalid = 'LICENSE_INVALID', invalid
  elseif rec.active == 0 then
    state.refusal = 'LICENSE_INACTIVE'
  elseif (rec.expires_at_ms or 0) > 0 and now >= rec.expires_at_ms then
    state.refusal = 'LICENSE_EXPIRED'
  end
  return state
end
