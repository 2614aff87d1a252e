--[[
  rate_limit: how many requests a session and a license were admitted
  lately, seat:{L}:hits:<session> and K.license_rate (keys.lua), each a small STRING

    "<window>:<count>:<count before>"
      window        the fixed window the counts belong to: floor(now / W),
                    W = the rate window (ARGV[5]) in ms
      count         requests admitted in that window
      count before  requests admitted in the window before it

  A sliding-window counter: the requests of the last W ms are estimated as
  the current window's count plus the previous window's count weighted by
  the share of the previous window still inside the last W ms. A request is
  refused when, admitted, that estimate would exceed the limit N.

  What it promises (docs/protocol.md, "Rate limits"), N the limit:
    - no fixed window (W ms, aligned on the Redis clock) admits more than N,
      and any W ms admit fewer than 2N (the worst case: a burst of N at the
      very end of one fixed window, then N more spread over the next);
    - requests spread evenly are counted as an exact sliding window counts
      them, and a burst after a quiet fixed window gets N, then refusals;
    - as the previous window's requests are taken as spread evenly, a
      request an exact window would admit may be refused; a client that
      stops gets its whole budget back within 2W, part of it sooner.
  Exact sliding windows kept a ZSET member per admitted request (four
  commands per limit per request); this costs a GET and a SET per limit.
]]
--- @include "keys"
--- @include "owners"

-- Whether the request arriving at `now` is refused: false when it is
-- admitted, else the outcome's detail, 0 for the session's or the
-- license's limit, 'application' for its application's (app_limit, on a
-- session '<app>/<id>': K.license_rate .. '/' .. app, a name no session's
-- key takes, ids holding no '/'). Every limit is checked first, and only a
-- request all admit is counted, in each (a refused one is not counted
-- anywhere). A limit of 0 is no limit and keeps no key.
local function rate_limited(now, session, session_limit, license_limit, window, app_limit)
  local app = app_limit > 0 and app_of(session)
  if session_limit <= 0 and license_limit <= 0 and not app then
    return false
  end
  -- Defined here, past the return above: a helper costs its closure on
  -- every run of a script, and a run without limits needs none.
  -- The counts stored in `key` as seen from fixed window `index` (`at`, the
  -- same as a string): this window's and the one before's, and whether the
  -- record is of this window already (and so has this window's expiry). A
  -- record of an older window counts as nothing, one of the window before
  -- moves back a slot, and one of a later window (the Redis clock was set
  -- back) is read as this one.
  local function window_counts(key, index, at)
    local raw = rcall('GET', key)
    if not raw then
      return 0, 0, false
    end
    local stored, count, before = string.match(raw, '^(%d+):(%d+):(%d+)$')
    if not stored then
      return 0, 0, false
    end
    -- Compared as strings first: the common case needs no number parsed.
    if stored == at or tonumber(stored) > index then
      return tonumber(count), tonumber(before), true
    elseif tonumber(stored) == index - 1 then
      return 0, tonumber(count), false
    end
    return 0, 0, false
  end
  local index = math.floor(now / window)
  local at = string.format('%d', index)
  -- The share of the window before that still lies within the last `window` ms.
  local weight = 1 - (now - index * window) / window
  local limits = {{K.license_rate .. ':' .. session, session_limit, 0}, {K.license_rate, license_limit, 0}}
  if app then
    limits[3] = {K.license_rate .. '/' .. app, app_limit, 'application'}
  end
  for _, l in ipairs(limits) do
    if l[2] > 0 then
      local count, before, current = window_counts(l[1], index, at)
      if count + 1 + before * weight > l[2] then
        return l[3]
      end
      l[4], l[5], l[6] = count + 1, before, current
    end
  end
  for _, l in ipairs(limits) do
    if l[2] > 0 then
      local record = string.format('%s:%d:%d', at, l[4], l[5])
      if l[6] then
        rcall('SET', l[1], record, 'KEEPTTL')
      else
        -- Read back as "the window before" all through the next window.
        rcall('SET', l[1], record, 'PXAT', string.format('%d', (index + 2) * window))
      end
    end
  end
  return false
end
