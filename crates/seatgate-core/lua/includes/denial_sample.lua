--[[
  denial_sample: whether a denial is recorded as a `denied` event of its own
  or folded into a count, so that a license refusing a flood of acquires
  writes a bounded number of events per window (each event is kept
  events.retention, 30 days) and still accounts for every denial.

  The request scripts call it before recording a `denied` event
  (request.lua), the reaper calls denial_flush (reap.lua); see
  docs/running.md, "Bounded growth".

  The window of one license is a small HASH, `key` (the caller passes it in
  KEYS: keys::Keys::denials, `<prefix>:{L}:denials`, in the license's slot):
    start    the Redis time (ms) the current window began
    n        denials in it so far
    folded   denials folded (not recorded) since the last one recorded or
             flushed
  It expires `window * LINGER_WINDOWS` after its last denial; a folded count
  neither carried by a later recorded denial nor flushed by then is lost from
  the events (the Prometheus denial counters count every denial anyway).

  denial_sample(key, now, window, keep) -> record, folded, due
    now     the Redis time, ms (clock.lua)
    window  the window, ms (at least 1)
    keep    denials per window recorded one by one; 0 = every one
    record  1: record this denial as its own event, carrying `folded`, the
            denials folded before it (0 most of the time); 0: record
            nothing, it was counted into `folded`
    due     when the reaper must visit the license to flush what this
            window folds (its end, ms): on the window's first fold only
            (the caller files it in the due index, ZADD LT); else 0
  denial_flush(key, now) -> folded, due
    For a pass that finds the license quiet (the reaper): the denials
    folded in a window that has ended, taken out (set to 0) so that they
    are reported once, by one aggregate event; 0 while the window runs,
    and then `due` is the window's end (else 0), for the pass to file.
]]

-- How many windows a quiet license's window HASH outlives its last denial.
local LINGER_WINDOWS = 10

local function denial_sample(key, now, window, keep)
  if keep <= 0 then
    return 1, 0, 0
  end
  local raw = rcall('HMGET', key, 'start', 'n', 'folded', 'window')
  local start, n, folded = tonumber(raw[1]), tonumber(raw[2]) or 0, tonumber(raw[3]) or 0
  -- A new window after the last one ended, or when the clock went back.
  if start == nil or now >= start + window or now < start then
    start, n = now, 0
  end
  n = n + 1
  local record = 0
  local carried = 0
  local due = 0
  if n <= keep then
    record, carried, folded = 1, folded, 0
  else
    folded = folded + 1
    if n == keep + 1 then
      due = start + window
    end
  end
  rcall('HSET', key, 'start', start, 'n', n, 'folded', folded, 'window', window)
  rcall('PEXPIRE', key, window * LINGER_WINDOWS)
  return record, carried, due
end

local function denial_flush(key, now)
  local raw = rcall('HMGET', key, 'start', 'folded', 'window')
  local start, folded, window = tonumber(raw[1]), tonumber(raw[2]) or 0, tonumber(raw[3])
  if start == nil or window == nil or folded == 0 then
    return 0, 0
  end
  if now < start + window then
    return 0, start + window
  end
  rcall('HSET', key, 'folded', 0)
  return folded, 0
end
