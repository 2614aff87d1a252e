--[[
  reap: one reaper step for one license. Evicts sessions whose last heartbeat
  is older than the heartbeat timeout, drops waiters whose wait ran out, hands
  free seats to the queue (self-healing: a seat freed by any path, even one
  whose event was lost, goes to the next waiter within one reaper period),
  and hands out again outbox notes whose deliverer died (or lost Redis)
  before delivering them.

  Cost is proportional to the stale sessions and expired waiters it removes
  (read off the low end of the holders and deadlines ZSETs), not to the
  sessions held. It stops after ARGV[2] of each and reports `more`, so no single
  call blocks Redis for long; the reaper calls it again until `more` is 0.

  KEYS[1..8] the license keys (includes/keys.lua)
  ARGV[1]  heartbeat timeout (ms) when the license sets no heartbeat_timeout_ms
  ARGV[2]  most sessions (and waiters) to remove in this call
  ARGV[3]  age (ms) after which an undelivered outbox note is handed out again

  Returns {seats_used, seats_total, now_ms, evicted, notes, more, queue_depth, redeliver}
    seats_used, seats_total  after the step
    now_ms       the Redis clock
    evicted      sessions evicted (each a seat-freed event, reason heartbeat_timeout)
    notes        GRANTED / QUEUE_TIMEOUT notes made by this step (includes/outbox.lua)
    more         1 when work is left: call again
    queue_depth  sessions still waiting
    redeliver    outbox notes to deliver again, as notes
  src/engine/scripts/reply.rs decodes this reply (Reaped).
  Emits no events: the reaper publishes them from the reply.
]]
local rcall = redis.call
--- @include "keys"
--- @include "clock"
--- @include "license"
--- @include "outbox"
--- @include "queue"

local default_timeout, limit = tonumber(ARGV[1]), tonumber(ARGV[2])

local now = now_ms()
local notes = {}
local timeout = tonumber(rcall('HGET', K.license, 'heartbeat_timeout_ms')) or default_timeout

-- Stale: last heartbeat strictly older than now - timeout.
local stale = rcall('ZRANGEBYSCORE', K.holders, '-inf', '(' .. (now - timeout), 'LIMIT', 0, limit)
for _, session in ipairs(stale) do
  rcall('ZREM', K.holders, session)
  rcall('HDEL', K.sessions, session)
end
local expired = expire_waiters(now, notes, limit)

local refusal, total = check_license(now)
local used, granted = rcall('ZCARD', K.holders), 0
if not refusal then
  used, granted = promote(now, total, notes, limit)
end

local more = 0
if #stale >= limit or expired >= limit or granted >= limit then
  more = 1
end
local redeliver = {}
if rcall('HLEN', K.outbox) > 0 then
  local pending = rcall('HGETALL', K.outbox)
  local cutoff = now - tonumber(ARGV[3])
  for i = 1, #pending, 2 do
    local n = cjson.decode(pending[i + 1])
    local fresh = false
    for _, m in ipairs(notes) do
      if m[6] == pending[i] then
        fresh = true
      end
    end
    if not fresh and n.at <= cutoff and #redeliver < limit then
      redeliver[#redeliver + 1] = outbox_note(pending[i], n)
    end
  end
end
return {used, total, now, stale, notes, more, rcall('ZCARD', K.queue), redeliver}
