--[[
  Helpers shared by every seat script. The Rust side prepends this file to
  each seat script at build time (src/scripts.rs), so each script stays one
  self-contained EVALSHA body.

  Every seat script takes the same KEYS, all carrying the hash tag {L} of one
  license, so all of them live in one Redis Cluster slot:
    KEYS[1]  seat:{L}:license    HASH  seats_total, expires_at_ms, active,
                                       heartbeat_timeout_ms?, queue_max?
    KEYS[2]  seat:{L}:holders    ZSET  session -> last heartbeat (ms); its size
                                       is the seats in use, its low end the stale
    KEYS[3]  seat:{L}:sessions   HASH  session -> "<acquired_at>:<heartbeats>:<meta>"
    KEYS[4]  seat:{L}:queue      ZSET  waiting session -> arrival number (FIFO)
    KEYS[5]  seat:{L}:waiters    HASH  waiting session -> JSON {id, reply_to, meta,
                                       queued_at}
    KEYS[6]  seat:{L}:deadlines  ZSET  waiting session -> give-up time (ms)
    KEYS[7]  seat:{L}:queue_seq  STRING arrival counter
    KEYS[8]  seat:{L}:outbox     HASH  note id -> note JSON: GRANTED / QUEUE_TIMEOUT
                                       replies not yet delivered
  acquire, release and heartbeat also take
    KEYS[9]  seat:{L}:done:<b>   HASH  stream entry id -> the reply it got, for
                                       entries added in time bucket b (expires)
    KEYS[10] seat:{L}:rate:<S>   ZSET  the session's recent requests (expires)
    KEYS[11] seat:{L}:rate       ZSET  the license's recent requests (expires)
  and the same first six ARGV:
    ARGV[1]  stream entry id of the request ('' = no dedupe)
    ARGV[2]  unix ms at which KEYS[9] may expire
    ARGV[3]  most requests per session per window (0 = no limit)
    ARGV[4]  most requests per license per window (0 = no limit)
    ARGV[5]  rate window, ms
    ARGV[6]  '1' to look for the reply the entry got before (the worker always
             asks: even a first delivery may have been decided by a worker that
             stalled past claim_idle_ms and had its batch claimed); '0' skips it

  Session records keep a ~60-byte metadata record small enough for listpack
  encoding and let heartbeats bump the count without decoding the JSON.

  Scripts report follow-up work in a `notes` list, each note
    {kind, session, request_id, reply_to, waited_ms, note_id}
  with kind GRANTED (a waiter now holds a seat) or QUEUE_TIMEOUT (a waiter gave
  up). Notes with a reply_to are also kept in the outbox until delivered: the
  worker (or reaper) sends each to its reply_to, publishes the event and HDELs
  it; the reaper re-delivers notes left in the outbox by a crash.
]]
local rcall = redis.call
local K = {
  license = KEYS[1], holders = KEYS[2], sessions = KEYS[3], queue = KEYS[4],
  waiters = KEYS[5], deadlines = KEYS[6], queue_seq = KEYS[7],
  outbox = KEYS[8], done = KEYS[9], session_rate = KEYS[10], license_rate = KEYS[11],
}

-- One clock for every worker: the Redis server's, in milliseconds.
local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Reads the license record and decides whether it may hand out seats now.
-- Returns (refusal status or nil, seats_total).
local function check_license(now)
  local f = rcall('HMGET', K.license, 'seats_total', 'expires_at_ms', 'active')
  local total = tonumber(f[1])
  if not total then
    return 'LICENSE_NOT_FOUND', 0
  end
  if f[3] == '0' then
    return 'LICENSE_INACTIVE', total
  end
  local expires = tonumber(f[2]) or 0
  if expires > 0 and now >= expires then
    return 'LICENSE_EXPIRED', total
  end
  return nil, total
end

local function new_session_record(now, meta)
  return now .. ':0:' .. meta
end

-- Adds a note to `notes` and, when it has somewhere to go, to the outbox.
local function note(notes, now, kind, session, w)
  local id = kind .. ':' .. session .. ':' .. now
  local waited = now - w.queued_at
  if w.reply_to ~= '' then
    rcall('HSET', K.outbox, id, cjson.encode({
      kind = kind, session = session, id = w.id, reply_to = w.reply_to, waited_ms = waited, at = now,
    }))
  end
  notes[#notes + 1] = {kind, session, w.id, w.reply_to, waited, id}
end

local function remove_waiter(session)
  rcall('ZREM', K.queue, session)
  rcall('ZREM', K.deadlines, session)
  rcall('HDEL', K.waiters, session)
end

-- Removes up to `limit` waiters whose wait ran out, noting QUEUE_TIMEOUT for each.
-- Returns how many it removed.
local function expire_waiters(now, notes, limit)
  local due = rcall('ZRANGEBYSCORE', K.deadlines, '-inf', now, 'LIMIT', 0, limit)
  for _, session in ipairs(due) do
    local raw = rcall('HGET', K.waiters, session)
    remove_waiter(session)
    if raw then
      note(notes, now, 'QUEUE_TIMEOUT', session, cjson.decode(raw))
    end
  end
  return #due
end

-- Hands free seats to the head of the queue, in arrival order, noting GRANTED
-- for each, at most `max` of them (a seats_total raised by thousands under a
-- long queue is granted over several calls). Only call it when the license
-- may hand out seats. Returns the seats in use afterwards and the grants made.
local function promote(now, total, notes, max)
  local used = rcall('ZCARD', K.holders)
  local granted = 0
  while used < total and granted < max do
    local head = rcall('ZRANGE', K.queue, 0, 0)[1]
    if not head then
      break
    end
    local raw = rcall('HGET', K.waiters, head)
    remove_waiter(head)
    if raw then
      local w = cjson.decode(raw)
      rcall('ZADD', K.holders, now, head)
      rcall('HSET', K.sessions, head, new_session_record(now, w.meta))
      used = used + 1
      granted = granted + 1
      note(notes, now, 'GRANTED', head, w)
    end
  end
  return used, granted
end

-- Redelivery dedupe: the reply a stream entry got, if it was decided before.
-- A replayed reply is marked changed = 0 and replayed = 1, so the worker
-- re-sends it (and re-delivers its notes) but publishes no second event.
local function replay(entry_id)
  if entry_id == '' then
    return nil
  end
  local raw = rcall('HGET', K.done, entry_id)
  if not raw then
    return nil
  end
  local result
  if string.sub(raw, 1, 1) == '[' then
    result = cjson.decode(raw)
  else
    local status, used, total, detail, now = string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
    result = {status, tonumber(used), tonumber(total), tonumber(detail) or detail, tonumber(now), {}}
  end
  result[7] = 0
  result[8] = 1
  return result
end

-- Remembers the reply `result` for `entry_id` until `expire_at` (unix ms).
-- The common case (no notes) is stored as "status|used|total|detail|now",
-- cheaper to write than JSON; results with notes are stored as JSON.
local function remember(entry_id, expire_at, result)
  if entry_id ~= '' then
    local encoded
    if #result[6] == 0 then
      encoded = result[1] .. '|' .. result[2] .. '|' .. result[3] .. '|' .. result[4] .. '|' .. result[5]
    else
      encoded = cjson.encode(result)
    end
    rcall('HSET', K.done, entry_id, encoded)
    rcall('PEXPIREAT', K.done, expire_at)
  end
  return result
end

-- Sliding-window rate limit over the session's and the license's recent
-- requests: drop entries older than the window, count, admit or refuse.
-- Admitted requests are recorded in both windows.
local function rate_limited(now, member, session_limit, license_limit, window)
  local windows = {{K.session_rate, session_limit}, {K.license_rate, license_limit}}
  for _, w in ipairs(windows) do
    if w[2] > 0 then
      rcall('ZREMRANGEBYSCORE', w[1], '-inf', now - window)
      if rcall('ZCARD', w[1]) >= w[2] then
        return true
      end
    end
  end
  for _, w in ipairs(windows) do
    if w[2] > 0 then
      rcall('ZADD', w[1], now, member)
      rcall('PEXPIRE', w[1], window)
    end
  end
  return false
end

-- The common prologue of acquire, release and heartbeat: a replayed reply,
-- or RATE_LIMITED, or nil to go on deciding. `limited` says whether this op
-- is rate limited at all (release is not: giving a seat back always works).
local function prologue(now, limited)
  local entry_id = ARGV[1]
  if ARGV[6] == '1' then
    local previous = replay(entry_id)
    if previous then
      return previous
    end
  end
  if limited and rate_limited(now, entry_id .. ':' .. now, tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])) then
    local total = tonumber(rcall('HGET', K.license, 'seats_total')) or 0
    return remember(entry_id, ARGV[2], {'RATE_LIMITED', rcall('ZCARD', K.holders), total, 0, now, {}})
  end
  return nil
end
