--[=[
  dedupe: the reply each request got, in KEYS[3] (done:<bucket>), so a
  redelivered entry, or the same request sent again as a new entry, gets it
  again and changes nothing.

  A request is known by its key (the field of the record):
    <entry id>                       an entry of the requests stream (or,
                                     sharded, of the base stream) without
                                     a caller id
    <shard>:<entry id>               the same on requests shard <shard>
    admin:<entry id>                 the same on the admin stream
    <lease hash><op>|<session>|<id>  a request that carries its caller's
                                     `id`: op A, R, H or V (acquire,
                                     release, heartbeat, revoke), the lease
                                     hash (lease.lua, '' without a lease)
                                     first, so that only the lease's holder
                                     can make or find the record
  Entry ids are unique per stream only, hence the stream in the key; a
  caller's id only per session and op, hence those (request.lua builds the
  last form from ARGV[1] when ARGV[6] is '2').

  The worker places an entry in the bucket of its id's time, or, when that
  time lies more than a window ahead of the Redis clock (a caller chose the
  id), in the bucket one window ahead of the clock: so a stream whose ids are
  stuck in a far-future millisecond does not grow one bucket forever. Such a
  placement moves on with the clock, so a redelivery may look one bucket
  later: it looks in KEYS[4], the bucket before, as well. A request keyed
  by its caller's id is placed by the clock (the worker's reading of it):
  two deliveries of it, as one entry or two, decided within a window of
  each other, look in the same bucket or the next, whichever entry comes
  first; it always looks in KEYS[4] too.

  The dedupe record, the value of the request's field: what the entry's outcome
  (outcome.lua) answered, {status, seats_used, seats_total, detail, notes}.
  Nearly every outcome has a number for detail, and is stored as those four
  numbers and words joined by ':', then a line per note (outbox.lua), its
  eight slots joined by tabs (the delivery slot empty when unset):
    ACQUIRED:1:5:0
    RELEASED:1:1:0\nGRANTED\tw1\tr-1\tseat:reply:w1\t2749\tGRANTED:w1:1796013944505\t1796013944505\t1
  (no JSON: a release that grants a waiter, on a contended license one in
  two requests, spent some 17 thousand instructions in cjson's encoder and
  its number formatting). Any other outcome (a detail that is a word or a
  table), and one whose note holds a tab or a newline (the protocol lets
  neither into an id, a session or a reply_to; a caller of the scripts
  might), is stored as a JSON array of the outcome's first six slots
  (now_ms fifth; cjson writes no notes as {}):
    ["NO_SEATS_AVAILABLE",5,5,"queue_full",1796013949007,{}]
  A JSON record starts with '[', the other with a status word. A replay
  answers with the Redis clock of the replay as now_ms, in both forms: the
  reply a client sees carries no time, and the worker reads the clock from
  it. Rust decodes both with engine::records::parse_dedupe_record.
  (This header uses level-1 long brackets: an example held a `]]`.)
]=]
--- @include "keys"
--- @include "clock"
--- @include "outcome"
--- @include "encoding"

-- The outcome stored for `entry_id` (a request's key), marked changed = 0
-- and replayed = 1 so the worker re-sends it (and re-delivers its notes) but
-- records no second event; nil when the request was not decided before.
local function replay(entry_id, now)
  if entry_id == '' then
    return nil
  end
  -- Defined here, not beside replay: a helper costs its closure on every
  -- run of a script, and only a run that looks for a replay needs this one.
  -- The outcome stored for `entry_id` in `key` as a replay at `now` answers
  -- it (changed = 0, replayed = 1), or nil.
  local function stored_outcome(key, entry_id, now)
    local raw = rcall('HGET', key, entry_id)
    if not raw then
      return nil
    end
    local status, used, total, detail, lines = string.match(raw, '^(%u[%u_]*):(%d+):(%d+):(%d+)(.*)$')
    if status then
      local notes = {}
      if lines ~= '' then
        -- Every line a note of eight slots, or the record is of no form.
        local rest = string.gsub(lines, '\n(%u[%u_]*)\t([^\t\n]*)\t([^\t\n]*)\t([^\t\n]*)\t(%-?%d+)\t([^\t\n]*)\t(%-?%d+)\t(%d?)',
          function(kind, session, id, reply_to, waited, note_id, at, delivery)
            notes[#notes + 1] = {kind, session, id, reply_to, tonumber(waited), note_id, tonumber(at), tonumber(delivery)}
            return ''
          end)
        if rest ~= '' then
          return nil
        end
      end
      return {status, tonumber(used), tonumber(total), tonumber(detail), now, notes, 0, 1}
    end
    -- A record in neither form counts as none: the entry is decided again, as
    -- past the window.
    local ok, r = pcall(cjson.decode, raw)
    if not ok or type(r) ~= 'table' or type(r[6]) ~= 'table' then
      return nil
    end
    return {r[1], r[2], r[3], r[4], now, r[6], 0, 1}
  end

  local r = stored_outcome(K.done, entry_id, now)
  if not r and K.done_before ~= K.done then
    r = stored_outcome(K.done_before, entry_id, now)
  end
  return r
end

-- Remembers outcome `result` for `entry_id` and returns it. The bucket
-- expires at `expire_at` (unix ms, as the worker passed it: two windows
-- after the bucket's start), but never later than two windows (`window` ms)
-- after now on the Redis clock (the outcome's now_ms): nothing a
-- caller-chosen entry id says outlives the dedupe window by more than that.
-- Numbers reach Redis as strings made with '%d': Lua would write them with
-- '%.14g', several times slower for a 13-digit time.
-- The bucket's expiry is set when the bucket is made, not on every record:
-- each record is written with the bucket's mark (field BUCKET_MARK, value
-- ''), so HSET answers 2 (the record and the mark new) only for a bucket
-- it made (or one a seatgate before the mark made, which had its expiry set
-- then). Every request of a bucket brings the same `expire_at` (its start
-- plus two windows), except a capped one, whose expiry moves on with the
-- clock: that one is set on every record, as before the mark. A key
-- deleted by hand, flushed or evicted is made again, with its expiry.
-- (PEXPIREAT costs about 5.6 thousand instructions a request.)
--
-- The write that makes a bucket also makes it a hashtable (encoding.lua):
-- a request's lookups mostly miss (a new request has no record), so in a
-- listpack bucket of a few hundred records its two lookups and its write
-- each read the whole bucket, up to 90 thousand instructions a request,
-- more than the rest of its decision; in a hashtable they cost the same at
-- any size. (A bucket over 512 records was a hashtable anyway: a busy
-- license's bucket costs the memory it did. A capped write leaves the mark
-- to the first write that is not, which then sets the bucket's expiry it
-- keeps, so a capped bucket, rare, may stay a listpack until then.)
local BUCKET_MARK = '_'
local function remember(entry_id, expire_at, window, result)
  if entry_id ~= '' then
    local record
    if type(result[4]) == 'number' then
      record = string.format('%s:%d:%d:%d', result[1], result[2], result[3], result[4])
      local notes = result[6]
      if notes[1] then
        for _, n in ipairs(notes) do
          -- Eight slots, one line: a tab or a newline in a slot would read as
          -- another (the note id is its kind, session and time). One
          -- concatenation and ms() for the numbers: a string.format costs
          -- some 1.9 thousand instructions, a string.gsub to check more.
          local text = n[2] .. n[3] .. n[4]
          if string.find(text, '\t', 1, true) or string.find(text, '\n', 1, true) then
            record = nil
            break
          end
          record = record .. '\n' .. n[1] .. '\t' .. n[2] .. '\t' .. n[3] .. '\t' .. n[4] .. '\t' .. ms(n[5]) .. '\t'
            .. n[6] .. '\t' .. ms(n[7]) .. '\t' .. (n[8] and ms(n[8]) or '')
        end
      end
    end
    if not record then
      record = cjson.encode({result[1], result[2], result[3], result[4], result[5], result[6]})
    end
    local cap = result[5] + 2 * window
    if tonumber(expire_at) > cap then
      rcall('HSET', K.done, entry_id, record)
      rcall('PEXPIREAT', K.done, string.format('%d', cap))
    elseif rcall('HSET', K.done, entry_id, record, BUCKET_MARK, '') == 2 then
      hset_as_hashtable(K.done, BUCKET_MARK, '')
      rcall('PEXPIREAT', K.done, expire_at)
    end
  end
  return result
end
