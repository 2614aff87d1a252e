--[=[
  dedupe: the reply each stream entry got, in KEYS[12] (done:<bucket>), so a
  redelivered entry gets it again and changes nothing.

  The worker places an entry in the bucket of its id's time, or, when that
  time lies more than a window ahead of the Redis clock (a caller chose the
  id), in the bucket one window ahead of the clock: so a stream whose ids are
  stuck in a far-future millisecond does not grow one bucket forever. Such a
  placement moves on with the clock, so a redelivery may look one bucket
  later: it looks in KEYS[15], the bucket before, as well.

  The dedupe record, the value of field <entry id>: the first six slots of
  the outcome (outcome.lua), {status, seats_used, seats_total, detail, now_ms,
  notes}, as a JSON array (cjson writes no notes as {}):
    ["ACQUIRED",1,5,0,1796013949007,{}]
    ["RELEASED",1,1,0,1796013944505,[["GRANTED","w1","r-1","reply:w1",2749,"GRANTED:w1:1796013944505"]]]
  36 bytes for an ACQUIRED, 8 more than a pipe-separated form; in exchange
  every record has one form, which the replay of earlier versions reads too.
  Rust decodes it with engine::records::parse_dedupe_record.
  (This header uses level-1 long brackets: the example holds a `]]`.)
]=]
--- @include "keys"
--- @include "outcome"

-- The outcome stored for `entry_id` in `key`, or nil.
local function stored_outcome(key, entry_id)
  local raw = rcall('HGET', key, entry_id)
  if not raw then
    return nil
  end
  -- A record in another form (written by an older version during a rolling
  -- upgrade) counts as none: the entry is decided again, as past the window.
  local ok, r = pcall(cjson.decode, raw)
  if not ok or type(r) ~= 'table' or type(r[6]) ~= 'table' then
    return nil
  end
  return r
end

-- The outcome stored for `entry_id`, marked changed = 0 and replayed = 1 so
-- the worker re-sends it (and re-delivers its notes) but publishes no second
-- event; nil when the entry was not decided before.
local function replay(entry_id)
  if entry_id == '' then
    return nil
  end
  local r = stored_outcome(K.done, entry_id)
  if not r and K.done_before ~= K.done then
    r = stored_outcome(K.done_before, entry_id)
  end
  if not r then
    return nil
  end
  return {r[1], r[2], r[3], r[4], r[5], r[6], 0, 1}
end

-- Remembers outcome `result` for `entry_id` and returns it. The bucket
-- expires at `expire_at` (unix ms: two windows after the bucket's start), but
-- never later than two windows (`window` ms) after now on the Redis clock
-- (the outcome's now_ms): nothing a caller-chosen entry id says outlives the
-- dedupe window by more than that.
local function remember(entry_id, expire_at, window, result)
  if entry_id ~= '' then
    local stored = {result[1], result[2], result[3], result[4], result[5], result[6]}
    rcall('HSET', K.done, entry_id, cjson.encode(stored))
    rcall('PEXPIREAT', K.done, math.min(tonumber(expire_at), result[5] + 2 * window))
  end
  return result
end
