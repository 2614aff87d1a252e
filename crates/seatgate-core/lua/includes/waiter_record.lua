--[[
  waiter_record: the waiter record, the value of a waiting session in
  K.waiters (keys.lua), the one place it is built and parsed in Lua; Rust
  reads it with engine::records::WaiterRecord (seatgate status). A file of
  its own so that a script that only reads a waiter (heartbeat) carries
  none of the queue (queue.lua).
  The compact form:
    "<queued_at>.<id>\n<reply_to>\n<meta>"              bound to no lease
    "<queued_at>~<lease_hash><id>\n<reply_to>\n<meta>"  bound to one
      queued_at   when it joined the queue (Redis clock, ms), in base 36
                  (digits and lowercase letters: 8 of them, not 13, until
                  2059)
      lease_hash  the hash of the lease the place (and the seat granted from
                  it) is bound to (lease.lua): 16 lowercase hex digits
      id          the request id the later GRANTED / QUEUE_TIMEOUT (or
                  SESSION_REVOKED) carries
      reply_to    where that reply goes: '' = nowhere; '*<rest>' for
                  'seat:reply:<rest>' (the default replies.prefix, spelt
                  out in nearly every record otherwise); '=<reply_to>' for
                  any other
      meta        the metadata JSON object, as sent, the seat will be stored
                  with; last, so it may hold anything, newlines included
  The protocol refuses control characters in an id and a reply_to, so
  neither holds a newline; should a caller of the scripts pass one anyway,
  the record is written in the JSON form below instead, which still reads.
  Why so tight: at 10,000 waiters on one license the record's string is
  allocated in 16-byte steps, so ~15 bytes fewer is one step fewer
  (docs/performance.md, "Where a queued waiter's bytes go"). The lease hash
  stays hex: 11 characters of base 64 would save 5 bytes and cost ~6 µs of
  Redis a waiter in Lua; raw bytes are no UTF-8 for Rust's readers.

  Records written by earlier versions, still in Redis after an upgrade,
  read as well (a waiter queued before it is granted, timed out or revoked
  as it would have been), and are rewritten in the compact form only when a
  re-sent acquire redirects them:
    plain  "<queued_at>:<lease_hash>:<id>\n<reply_to>\n<meta>" (decimal
           queued_at, 16 hex digits or nothing, reply_to as it is)
    JSON   {"id", "reply_to", "meta", "queued_at", "lease_hash"?}
  A JSON record starts with '{'; the plain form has a ':' after its digits,
  the compact one a '.' or '~' after its base-36 digits.
]]
--- @include "keys"

-- The digits of a waiter record's queued_at (above), and 36^8: eight of
-- them hold every ms until 2059.
local BASE36 = '0123456789abcdefghijklmnopqrstuvwxyz'
local BASE36_8 = 2821109907456
-- The default replies.prefix, written '*' in a record's reply_to.
local DEFAULT_REPLY_PREFIX = 'seat:reply:'

-- The record of a waiter that queued at `queued_at` (ms: a number, or the
-- digits of a record read back), bound to lease hash `lease` ('' = none,
-- else 16 hex digits; any other is kept in a JSON record).
local function encode_waiter_record(queued_at, lease, id, reply_to, meta)
  queued_at = tonumber(queued_at)
  if string.find(id, '\n', 1, true) or string.find(reply_to, '\n', 1, true)
      or (lease ~= '' and (#lease ~= 16 or string.find(lease, '%X')))
      or not (queued_at >= 0 and queued_at < 2 ^ 53 and queued_at == math.floor(queued_at)) then
    -- Never from a request the worker let through (see above), nor from a
    -- record the scripts wrote: only a JSON record of a foreign hand, kept
    -- exactly as it came when a re-sent acquire redirects it.
    local w = {id = id, reply_to = reply_to, meta = meta, queued_at = queued_at}
    if lease ~= '' then
      w.lease_hash = lease
    end
    return cjson.encode(w)
  end
  -- Eight digits without a loop or a table (a tenth of the time of the
  -- general loop below in Redis's Lua); exact, as a time in ms is far below
  -- 2^53. Those above them, from 2059 on, the slow way.
  local n = queued_at % BASE36_8
  local high = (queued_at - n) / BASE36_8
  local d8 = n % 36; n = (n - d8) / 36
  local d7 = n % 36; n = (n - d7) / 36
  local d6 = n % 36; n = (n - d6) / 36
  local d5 = n % 36; n = (n - d5) / 36
  local d4 = n % 36; n = (n - d4) / 36
  local d3 = n % 36; n = (n - d3) / 36
  local d2 = n % 36; n = (n - d2) / 36
  local at = string.char(n < 10 and 48 + n or 87 + n, d2 < 10 and 48 + d2 or 87 + d2,
    d3 < 10 and 48 + d3 or 87 + d3, d4 < 10 and 48 + d4 or 87 + d4, d5 < 10 and 48 + d5 or 87 + d5,
    d6 < 10 and 48 + d6 or 87 + d6, d7 < 10 and 48 + d7 or 87 + d7, d8 < 10 and 48 + d8 or 87 + d8)
  while high > 0 do
    local d = high % 36
    at = string.sub(BASE36, d + 1, d + 1) .. at
    high = (high - d) / 36
  end
  local bound = lease == '' and '.' or '~' .. lease
  if reply_to ~= '' then
    if string.sub(reply_to, 1, #DEFAULT_REPLY_PREFIX) == DEFAULT_REPLY_PREFIX then
      reply_to = '*' .. string.sub(reply_to, #DEFAULT_REPLY_PREFIX + 1)
    else
      reply_to = '=' .. reply_to
    end
  end
  return at .. bound .. id .. '\n' .. reply_to .. '\n' .. meta
end

-- The waiter record of `session`, read in any form: a table
-- {queued_at (number), lease_hash ('' for none, else 16 hex digits), id,
-- reply_to, meta}; nil when it has none, or one of no form (then treated
-- as gone).
local function waiter_record(session)
  local raw = rcall('HGET', K.waiters, session)
  if not raw then
    return nil
  end
  -- One match for each compact form, failing at once on the others.
  local lease = ''
  local at, id, reply_to, meta = string.match(raw, '^([0-9a-z]+)%.([^\n]*)\n([^\n]*)\n(.*)$')
  if not at then
    at, lease, id, reply_to, meta = string.match(raw,
      '^([0-9a-z]+)~(%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x)([^\n]*)\n([^\n]*)\n(.*)$')
  end
  if at then
    local mark = string.byte(reply_to, 1)
    if mark == 42 then -- '*'
      reply_to = DEFAULT_REPLY_PREFIX .. string.sub(reply_to, 2)
    elseif mark == 61 then -- '='
      reply_to = string.sub(reply_to, 2)
    elseif mark then
      return nil
    end
    return {queued_at = tonumber(at, 36), lease_hash = lease, id = id, reply_to = reply_to, meta = meta}
  end
  if string.byte(raw, 1) == 123 then -- '{'
    local ok, w = pcall(cjson.decode, raw)
    if not (ok and type(w) == 'table' and type(w.queued_at) == 'number' and type(w.id) == 'string'
        and type(w.reply_to) == 'string' and type(w.meta) == 'string') then
      return nil
    end
    w.lease_hash = w.lease_hash or ''
    return w
  end
  local queued_at, lease, id, plain_reply_to, plain_meta = string.match(raw, '^(%d+):(%x*):([^\n]*)\n([^\n]*)\n(.*)$')
  if not queued_at or (lease ~= '' and #lease ~= 16) then
    return nil
  end
  return {queued_at = tonumber(queued_at), lease_hash = lease, id = id, reply_to = plain_reply_to, meta = plain_meta}
end
