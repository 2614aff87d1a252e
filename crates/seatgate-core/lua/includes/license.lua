--[[
  license: reading the license record, KEYS[1] (keys.lua), under its rules.

  The rules, checked in this order (their Rust home is src/engine/license.rs,
  StoredRecord::validate; tests/it/lease.rs runs both on the same values):
    seats_total           digits, 0 to 1000000 (absent: there is no license)
    expires_at_ms         digits, 0 (absent or 0: never) or 978307200000
                          (2001-01-01) to 999999999999999: below is a
                          time written in seconds, never a real expiry
    active                0 or 1 (absent: active)
    heartbeat_timeout_ms  digits, 1 to 999999999999999 (absent: the default)
    queue_max             digits, 1 to 999999999999999 (absent: the default)
    policy                0 or 1 (absent: 0); accepted for compatibility, it
                          switches nothing: the policy fields below are read
                          and checked (by policy.lua, with license_number)
                          whenever the record holds any, after the fields
                          above:
    max_per_user          digits, 0 to 999999999999999
    max_priority          digits, 0 to 9
    linger_ms             digits, 0 to 999999999999999
    max_borrow_ms         digits, 0 to 31536000000 (a year)
    require_user          0 or 1: 1 refuses an acquire without a user
    queue_max_per_user    digits, 0 to 999999999999999
    queue_max_per_group   digits, 0 to 999999999999999
    group_max:<g>         digits, 0 to 1000000, in field name order, and
    group_reserve:<g>     <g> an id like a session's
    application:<app>     0 or 1, <app> an application's name: a record
                          with any lets only those at 1 use it
  Digits only: tonumber alone would take "0x10", " 5", "1e3", "inf" and
  "nan", and a record read that way fails open (5.5 seats hand out 6, inf is
  unlimited, an expiry that is no number never comes). A record that breaks a
  rule hands out no seat: acquires get LICENSE_INVALID naming the field.
  Fifteen digits stay below 2^53, so every allowed value is an exact number.
]]
--- @include "keys"

-- The number `raw` stands for under `field`'s rule; nil when it breaks it.
-- The rules as one chain of comparisons rather than a table of them: a
-- table is built, and collected, on every run of a script (the license's and
-- the policy fields' rules cost about 13 thousand instructions a call).
local function license_number(field, raw)
  -- Smallest value, largest value, most digits.
  local low, high, digits
  if field == 'seats_total' then
    low, high, digits = 0, 1000000, 7
  elseif field == 'expires_at_ms' then
    low, high, digits = 0, 999999999999999, 15
  elseif field == 'active' or field == 'policy' or field == 'require_user' or field == 'application' then
    low, high, digits = 0, 1, 1
  elseif field == 'heartbeat_timeout_ms' or field == 'queue_max' then
    low, high, digits = 1, 999999999999999, 15
  -- The policy fields, checked by policy.lua only.
  elseif field == 'max_per_user' or field == 'linger_ms' or field == 'queue_max_per_user'
      or field == 'queue_max_per_group' then
    low, high, digits = 0, 999999999999999, 15
  elseif field == 'max_priority' then
    low, high, digits = 0, 9, 1
  elseif field == 'max_borrow_ms' then
    low, high, digits = 0, 31536000000, 11
  elseif field == 'group_max' or field == 'group_reserve' then
    low, high, digits = 0, 1000000, 7
  else
    error('no rule for license field ' .. field)
  end
  if #raw > digits or not string.find(raw, '^%d+$') then
    return nil
  end
  local n = tonumber(raw)
  if n < low or n > high or (n > 0 and n < 978307200000 and field == 'expires_at_ms') then
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

-- The heartbeat timeout in force (ms): the license's heartbeat_timeout_ms,
-- or `default` (the service's) when it has none or one that breaks the rule.
local function heartbeat_timeout(default)
  local raw = rcall('HGET', K.license, 'heartbeat_timeout_ms')
  return raw and license_number('heartbeat_timeout_ms', raw) or default
end

-- Reads the license record and decides whether it may hand out seats now.
-- Returns a table:
--   refusal   nil, or LICENSE_NOT_FOUND | LICENSE_INVALID | LICENSE_INACTIVE | LICENSE_EXPIRED
--   total     seats_total (0 when absent or invalid)
--   invalid   for LICENSE_INVALID, {field, value} of the first field that
--             breaks its rule (the value cut to 64 bytes): the outcome's detail
--   heartbeat_timeout_ms, queue_max   the record's, when present and valid
--   policy    whether the record holds more fields than the six read here:
--             policy fields (or fields of no rule), which policy.lua reads
--             (only for a license that may hand out seats; else false)
--   record    the record as HGETALL returned it, for policy.lua's read
-- `value` of `field` (nil: absent) under its rule, and `invalid`, or
-- {field, value cut to 64 bytes} when `invalid` is nil and `value` breaks
-- the rule.
local function license_field(field, value, invalid)
  if not value then
    return nil, invalid
  end
  local n = license_number(field, value)
  if n == nil and not invalid then
    invalid = {field, string.sub(value, 1, 64)}
  end
  return n, invalid
end

-- The records parsed before, by license key: {flat, total, invalid, active,
-- expires_at, timeout, queue_max, extra, found}. In the function library
-- they are kept from call to call, and a record read again with the same
-- fields and values in the same order is the same record (a Lua string
-- compares by identity: one comparison a field), so its rules are checked
-- once per distinct record, not on every call. At most PARSED_MAX licenses
-- are kept; past that the cache starts afresh (the size: keys.lua's
-- KEYED_MAX).
local PARSED_MAX = 4096
local parsed, parsed_count = {}, 0

-- The record `flat` (HGETALL's reply: a record without policies holds two
-- to six fields) checked under the rules: its six fields read here, and
-- whether it holds more. The policies, when it does, are read from the
-- same reply (policy.lua).
local function parse_license(flat)
  local seats, expires, act, hb, qmax, flag
  local extra = false
  for i = 1, #flat, 2 do
    local field = flat[i]
    if field == 'seats_total' then
      seats = flat[i + 1]
    elseif field == 'expires_at_ms' then
      expires = flat[i + 1]
    elseif field == 'active' then
      act = flat[i + 1]
    elseif field == 'heartbeat_timeout_ms' then
      hb = flat[i + 1]
    elseif field == 'queue_max' then
      qmax = flat[i + 1]
    elseif field == 'policy' then
      flag = flat[i + 1]
    else
      extra = true
    end
  end
  local total, invalid = license_field('seats_total', seats, nil)
  local expires_at, active, timeout, queue_max, _
  expires_at, invalid = license_field('expires_at_ms', expires, invalid)
  active, invalid = license_field('active', act, invalid)
  timeout, invalid = license_field('heartbeat_timeout_ms', hb, invalid)
  queue_max, invalid = license_field('queue_max', qmax, invalid)
  -- `policy` keeps its rule, and means nothing else.
  _, invalid = license_field('policy', flag, invalid)
  return {flat = flat, total = total or 0, invalid = invalid, active = active, expires_at = expires_at or 0,
    timeout = timeout, queue_max = queue_max, extra = extra, found = seats ~= nil}
end

-- Whether lists `a` and `b` hold the same values in the same order.
local function same_list(a, b)
  if #a ~= #b then
    return false
  end
  for i = 1, #a do
    if a[i] ~= b[i] then
      return false
    end
  end
  return true
end

-- `flat` parsed: the cached parse of the license's record when it is the
-- same record, else a new one, kept.
local function parsed_license(flat)
  local key = K.license
  local p = parsed[key]
  if p and same_list(p.flat, flat) then
    return p
  end
  if not p then
    if parsed_count >= PARSED_MAX then
      parsed, parsed_count = {}, 0
    end
    parsed_count = parsed_count + 1
  end
  p = parse_license(flat)
  parsed[key] = p
  return p
end

local function license_state(now)
  local flat = rcall('HGETALL', K.license)
  local p = parsed_license(flat)
  local state = {
    total = p.total,
    heartbeat_timeout_ms = p.timeout,
    queue_max = p.queue_max,
    policy = false,
    record = flat,
  }
  if not p.found then
    state.refusal = 'LICENSE_NOT_FOUND'
  elseif p.invalid then
    state.refusal, state.invalid = 'LICENSE_INVALID', p.invalid
  elseif p.active == 0 then
    state.refusal = 'LICENSE_INACTIVE'
  elseif p.expires_at > 0 and now >= p.expires_at then
    state.refusal = 'LICENSE_EXPIRED'
  else
    -- Policy fields (or fields of no rule), whatever `policy` says: a
    -- limit written without the flag is never silently ignored.
    state.policy = p.extra
  end
  return state
end
