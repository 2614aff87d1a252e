--[[
  reap: one reaper step for one license. Evicts sessions whose last heartbeat
  is older than the heartbeat timeout, drops waiters whose wait ran out, and
  hands free seats to the queue (self-healing: a seat freed by any path, even
  one whose event was lost, goes to the next waiter within one reaper period).

  Cost is proportional to the stale sessions and expired waiters it removes
  (read off the low end of the holders and deadlines ZSETs), not to the
  sessions held. It stops after ARGV[2] of each and reports `more`, so no single
  call blocks Redis for long; the reaper calls it again until `more` is 0.

  KEYS     the first seven keys of lua/includes/common.lua
  ARGV[1]  heartbeat timeout (ms) when the license sets no heartbeat_timeout_ms
  ARGV[2]  most sessions (and waiters) to remove in this call

  Returns {seats_used, seats_total, now_ms, evicted, notes, more, queue_depth}
    evicted  sessions evicted (each a seat-freed event, reason heartbeat_timeout)
    notes    GRANTED / QUEUE_TIMEOUT notes, as in common.lua
]]
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
local used
if refusal then
  used = rcall('ZCARD', K.holders)
else
  used = promote(now, total, notes)
end
local more = 0
if #stale >= limit or expired >= limit then
  more = 1
end
return {used, total, now, stale, notes, more, rcall('ZCARD', K.queue)}
