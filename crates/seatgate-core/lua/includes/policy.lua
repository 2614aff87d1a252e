--[[
  policy: the license policies, decided inside the seat scripts for direct
  acquires and for grants to waiters alike.

  They live in the license record, KEYS[1], and are read from the
  HGETALL license_state made (license.lua) whenever the record holds more
  fields than its six, whatever its `policy` field says: a limit written
  without the flag is enforced, never silently ignored. A license without
  them costs nothing more:
    max_per_user       one user holds at most that many seats
    group_max:<g>      group g holds at most that many seats
    group_reserve:<g>  that many seats are kept for group g: others may use
                       only seats_total minus what g's reservation leaves unused
    max_priority       the highest priority an acquire gets (0-9; absent: 0, so a license grants queue priority only when it raises this)
    linger_ms          a released seat stays with its session that long
    max_borrow_ms      the longest borrow an acquire may ask for (absent:
                       borrowing is off)
    require_user       1: an acquire without a user is refused (LIMIT_REACHED
                       require_user), so omitting `user` escapes no limit
    queue_max_per_user one user has at most that many sessions waiting in
                       the queue; an acquire that would queue one more is
                       refused NO_SEATS_AVAILABLE 'queue_user_full'
                       (acquire.lua; counted as w:<user>, owners.lua)
    application:<app>  1: the application may use the license; a record
                       with any such field lets only those at 1 (an
                       acquire of another, or of the shared stream, is
                       refused LIMIT_REACHED 'application', acquire.lua)
    queue_max_per_group one group has at most that many sessions waiting;
                       one more is refused NO_SEATS_AVAILABLE
                       'queue_group_full' (counted as wg:<group>), so one
                       group cannot fill the queue ahead of the others
  Each is a whole number in plain digits, under the rules license.lua lists
  (policy().read() checks them): a record breaking one hands out no seat,
  LICENSE_INVALID naming the field, as for the other fields.
  Who asks comes with the acquire: user, group, priority, borrow_ms. An
  acquire without a user is under no per-user limit (unless require_user
  refuses it), one without a group under no per-group limit (and takes no
  reserved seat). A license with a group map (K.groups, keys.lua:
  user -> group) decides the group itself: the request's group is its
  user's there (none for a user not in it), and a request claiming another
  is refused, LIMIT_REACHED group_map (acquire.lua).

  Seats held count lingering and borrowed ones (owners.lua), and lowering a
  limit evicts nobody: it only keeps new seats from those above it.

  Fair skipping: a waiter that its own limit (or others' reservations)
  keeps from a free seat keeps its place, and the waiters behind it who can
  take one are granted in queue order; nobody is granted ahead of a waiter
  who could have taken the seat. A grant step passes over a group its
  group_max or others' reservations block whole, by the queue by group
  (queue.lua), so its cost grows with the groups waiting (at most
  MAX_GROUPS), not with their waiters; within a group it passes over a user
  its own max_per_user blocks whole, by the queue by user, so it grows with
  the users waiting in the group (at most MAX_GROUPS), not with their
  waiters. (A queue of waiters from before the index by user, which only the
  group index holds, looks past at most SKIP_LIMIT blocked waiters of a
  group until they are gone.) A direct acquire takes a
  free seat while others wait only when the step found every one of them
  unable to take it.

  Cost: a license without policies pays for none of this but one call of
  grant_waiters: the helpers
  are built by policy() the first time a script run needs them (a Lua
  function costs its closure on every run).
]]
--- @include "keys"
--- @include "license"
--- @include "owners"
--- @include "queue"

-- Whether `s` names a user or group as the license may: a plain id, or an
-- application's, '<app>/<id>' (src/tenancy.rs, valid_stored_id).
local function owner_id(s)
  local app, id = string.match(s, '^([A-Za-z0-9._-]+)/([A-Za-z0-9._:@-]+)$')
  if app then
    return #app <= 64 and #id <= 128
  end
  return #s <= 128 and string.find(s, '^[A-Za-z0-9._:@-]+$') ~= nil
end

-- Most waiters one grant step looks past (waiters that cannot be granted
-- now): the bound on a step's cost. engine::policy::SKIP_LIMIT mirrors it.
local SKIP_LIMIT = 50

-- Most groups with waiters one grant step looks at (fair_promote): the
-- bound on a step's cost in groups. engine::policy::MAX_GROUPS mirrors it.
local MAX_GROUPS = 256

local policy_built
-- The policy helpers.
local function policy()
  if policy_built then
    return policy_built
  end
  local M = {}

  -- The policy fields' rules are license.lua's, in license_number.
  local SCALARS = {'max_per_user', 'max_priority', 'linger_ms', 'max_borrow_ms', 'require_user', 'queue_max_per_user', 'queue_max_per_group'}

  -- The license's policies, read from its whole record, and the first field
  -- that breaks its rule ({field, value}, as license_state reports one:
  -- the scalars in the order above, then group fields by name), or nil.
  -- `limits` says whether any policy can keep a waiter from a free seat;
  -- `counts` caches the seats held per owners field for this script run.
  -- `flat` is the record's HGETALL, when the caller read it (license_state).
  function M.read(flat)
    flat = flat or rcall('HGETALL', K.license)
    local P = {group_max = {}, group_reserve = {}, counts = {}, limits = false, max_priority = 0}
    local raw, bad_group = {}, nil
    for i = 1, #flat, 2 do
      local field, value = flat[i], flat[i + 1]
      local kind, group = string.match(field, '^([%a_]+):(.*)$')
      if kind == 'group_max' or kind == 'group_reserve' or kind == 'application' then
        local n = license_number(kind, value)
        local named
        if kind == 'application' then
          named = #group <= 64 and string.find(group, '^[A-Za-z0-9._-]+$') ~= nil
          P.applications = P.applications or {}
        else
          named = owner_id(group)
        end
        if n and named then
          if kind == 'application' then
            P.applications[group] = n == 1
          else
            P[kind][group] = n
          end
        elseif not bad_group or field < bad_group[1] then
          bad_group = {field, string.sub(value, 1, 64)}
        end
      else
        raw[field] = value
      end
    end
    for _, field in ipairs(SCALARS) do
      local value = raw[field]
      if value then
        P[field] = license_number(field, value)
        if P[field] == nil then
          return nil, {field, string.sub(value, 1, 64)}
        end
      end
    end
    if bad_group then
      return nil, bad_group
    end
    P.max_priority = P.max_priority or 0
    P.limits = P.max_per_user ~= nil or next(P.group_max) ~= nil or next(P.group_reserve) ~= nil
    return P, nil
  end

  -- Seats held under owners field `field` (u:<user>, g:<group>).
  local function held(P, field)
    local n = P.counts[field]
    if n == nil then
      n = tonumber(rcall('HGET', K.owners, field)) or 0
      P.counts[field] = n
    end
    return n
  end

  -- Reads in one HMGET the counts seat_refusal may need for `who` that
  -- this run has not read yet: its user's, its group's and every reserved
  -- group's.
  function M.prefetch(P, who)
    local wanted = {}
    local function want(field)
      if P.counts[field] == nil then
        wanted[#wanted + 1] = field
      end
    end
    if P.max_per_user and who.user ~= '' then
      want('u:' .. who.user)
    end
    if who.group ~= '' and P.group_max[who.group] then
      want('g:' .. who.group)
    end
    for group in pairs(P.group_reserve) do
      want('g:' .. group)
    end
    if #wanted > 0 then
      local counts = rcall('HMGET', K.owners, unpack(wanted))
      for i, field in ipairs(wanted) do
        P.counts[field] = tonumber(counts[i]) or 0
      end
    end
  end

  -- Seats reserved for groups other than `group` that they do not use.
  local function reserved_for_others(P, group)
    local n = 0
    for g, reserve in pairs(P.group_reserve) do
      if g ~= group then
        local used = held(P, 'g:' .. g)
        if used < reserve then
          n = n + reserve - used
        end
      end
    end
    return n
  end

  -- Why `who` ({user, group}) may not take a seat now, with `used` of
  -- `total` held: 'max_per_user' or 'group_max' (its own limit), 'full',
  -- or 'reserved' (the free seats are others'); nil when it may.
  function M.seat_refusal(P, who, used, total)
    if P.max_per_user and who.user ~= '' and held(P, 'u:' .. who.user) >= P.max_per_user then
      return 'max_per_user'
    end
    local group_max = who.group ~= '' and P.group_max[who.group]
    if group_max and held(P, 'g:' .. who.group) >= group_max then
      return 'group_max'
    end
    if used >= total then
      return 'full'
    end
    if total - used - reserved_for_others(P, who.group) < 1 then
      return 'reserved'
    end
    return nil
  end

  local NOBODY = {user = '', group = '', borrow_ms = 0}

  -- Hands free seats to waiters in queue order under the limits. Returns
  -- the seats in use afterwards, the grants made, and whether nobody left
  -- waiting could take a free seat (so a direct acquire may take one).
  --
  -- By group (K.queue_by_group, queue.lua): each step looks at every
  -- group's first waiter. A group its group_max, or others' reservations,
  -- keep from a seat is passed over whole, at one ZRANGEBYLEX, however many
  -- of it wait; in a group that may take one, each user's first waiter is
  -- looked at (K.queue_by_user), a user its own max_per_user blocks passed
  -- over whole; the first waiter in queue order among those that may take
  -- a seat is granted, and the step goes on. A queue of before the index (its
  -- count differs from the queue's) is granted by scan_promote, the older
  -- bounded scan, until its waiters are gone.
  function M.fair_promote(now, total, notes, max, P)
    local used = rcall('ZCARD', K.holders)
    if used >= total then
      return used, 0, false
    end
    local depth = rcall('ZCARD', K.queue)
    if depth == 0 then
      return used, 0, true
    end
    if rcall('ZCARD', K.queue_by_group) ~= depth then
      return M.scan_promote(now, total, notes, max, P, used)
    end
    M.prefetch(P, NOBODY)
    -- Waiters queued before K.queue_by_user existed are in the group index
    -- only: their group's waiters are looked at in order, as before.
    local by_user = rcall('ZCARD', K.queue_by_user) == depth
    local granted = 0
    while used < total and granted < max do
      local best, best_order, best_who, complete = nil, nil, nil, true
      local cursor, groups = '-', 0
      while true do
        local first = rcall('ZRANGEBYLEX', K.queue_by_group, cursor, '+', 'LIMIT', '0', '1')[1]
        if not first then
          break
        end
        groups = groups + 1
        if groups > MAX_GROUPS then
          complete = false
          break
        end
        local group = string.match(first, '^([^|]*)|')
        local upper = '(' .. group .. '}'
        cursor = upper
        if not M.seat_refusal(P, {user = '', group = group}, used, total) then
          -- The group may take a seat: its first waiter whose user may too.
          if by_user then
            -- Each of its users' first waiter (K.queue_by_user), a user
            -- its own limit blocks passed over whole.
            local from, users = '[' .. group .. '|', 0
            while true do
              local head = rcall('ZRANGEBYLEX', K.queue_by_user, from, upper, 'LIMIT', '0', '1')[1]
              if not head then
                break
              end
              users = users + 1
              if users > MAX_GROUPS then
                complete = false
                break
              end
              local user, order, session = string.match(head, '^[^|]*|([^|]*)|([^|]*)|(.*)$')
              from = '(' .. group .. '|' .. user .. '}'
              if not best_order or order < best_order then
                local who = owner_of(session) or NOBODY
                if not M.seat_refusal(P, who, used, total) then
                  best, best_order, best_who = session, order, who
                end
              end
            end
          else
            local member, looked, batch, at = first, 0, nil, 0
            while member do
              local order, session = string.match(member, '^[^|]*|([^|]*)|(.*)$')
              if best_order and order > best_order then
                break
              end
              local who = owner_of(session) or NOBODY
              if not M.seat_refusal(P, who, used, total) then
                best, best_order, best_who = session, order, who
                break
              end
              looked = looked + 1
              if looked > SKIP_LIMIT then
                complete = false
                break
              end
              if not batch or at >= #batch then
                batch, at = rcall('ZRANGEBYLEX', K.queue_by_group, '(' .. member, upper, 'LIMIT', '0', SKIP_LIMIT), 0
              end
              at = at + 1
              member = batch[at]
            end
          end
        end
      end
      if not best then
        return used, granted, complete
      end
      if grant(best, now, notes, used + 1) then
        used, granted = used + 1, granted + 1
        P.counts['u:' .. best_who.user], P.counts['g:' .. best_who.group] = nil, nil
      end
    end
    return used, granted, false
  end

  -- The grant step of a queue some of whose waiters are not in
  -- K.queue_by_group (queued before it): in queue order under the limits,
  -- looking past at most SKIP_LIMIT waiters that cannot take a seat.
  function M.scan_promote(now, total, notes, max, P, used)
    local window = rcall('ZRANGE', K.queue, 0, SKIP_LIMIT + max - 1)
    if #window == 0 then
      return used, 0, true
    end
    local fields = {}
    for i, session in ipairs(window) do
      fields[i] = 's:' .. session
    end
    local records = rcall('HMGET', K.owners, unpack(fields))
    M.prefetch(P, NOBODY)
    local granted, skipped = 0, 0
    for i, session in ipairs(window) do
      if used >= total or granted >= max then
        return used, granted, false
      end
      local who = owner_of(session, records[i]) or NOBODY
      if M.seat_refusal(P, who, used, total) then
        skipped = skipped + 1
        if skipped > SKIP_LIMIT then
          return used, granted, false
        end
      elseif grant(session, now, notes, used + 1) then
        used, granted = used + 1, granted + 1
        P.counts['u:' .. who.user], P.counts['g:' .. who.group] = nil, nil
      end
    end
    return used, granted, #window < SKIP_LIMIT + max
  end

  -- The priority a waiter's queue score stands for (queue.lua).
  function M.score_priority(score)
    return math.floor((PRIORITY_STEP - tonumber(score) - 1) / PRIORITY_STEP)
  end

  -- A QUEUED outcome's detail: the position, or {position, priority} above 0.
  function M.queued_detail(position, priority)
    if priority > 0 then
      return {position, priority}
    end
    return position
  end

  policy_built = M
  return M
end

-- Hands free seats to the queue under policies `P` (nil: none; from
-- policy().read()), at most `max`. Only call it when the license may hand
-- out seats. Returns the seats in use afterwards, the grants made, and
-- whether nobody is left waiting who could take a free seat.
local function grant_waiters(now, total, notes, max, P)
  if P and P.limits then
    return policy().fair_promote(now, total, notes, max, P)
  end
  return promote(now, total, notes, max)
end
