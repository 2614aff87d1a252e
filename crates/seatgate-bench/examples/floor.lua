#!lua name=seatgate_floor
--[[
  The floor of a direct acquire and release, for ops/callgrind.sh's `floor`
  and `floor-worker` modes (examples/script_calls.rs): functions called
  with the very KEYS and ARGV of seatgate's own, that run the same Redis
  commands with the same arguments as they do on the benchmark's path
  (captured with MONITOR: a fresh session's acquire of a free seat, its
  release; a worker's call adds the redelivery lookup and record) and
  return an outcome of the same size, and decide nothing. What a call costs Redis
  with no logic at all: the function call, its arguments and reply, the
  commands. Never loaded by seatgate; a measuring stick only.
]]

-- The license's keys, derived from KEYS[1] once per license.
local names = {}
local function keys_of(license_key)
  local k = names[license_key]
  if not k then
    local p = string.sub(license_key, 1, -8)
    k = {
      sessions = p .. 'sessions',
      holders = p .. 'holders',
      queue = p .. 'queue',
      deadlines = p .. 'deadlines',
      revocations = p .. 'revocations',
      owners = p .. 'owners',
      seq = p .. 'event_seq',
      id = string.match(license_key, '{(.-)}'),
    }
    names[license_key] = k
  end
  return k
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The request's event, as events.lua writes it.
local function event(keys, k, kind, session, used, total, at)
  local seq = redis.call('INCR', k.seq)
  redis.call('XADD', keys[2], '*', 'type', kind, 'license', k.id, 'session', session,
    'seats_used', string.format('%d', used), 'seats_total', total, 'at_ms', at,
    'seq', string.format('%d', seq))
end

-- The redelivery lookup of a worker's call (ARGV[3] ~= '0'): the request's
-- key in its dedupe buckets (one, when both are the same), as dedupe.lua
-- reads them.
local function looked_up(keys, args)
  if args[3] == '0' then
    return false
  end
  redis.call('HGET', keys[3], args[1])
  if keys[4] ~= keys[3] then
    redis.call('HGET', keys[4], args[1])
  end
  return true
end

-- ... and its record of the outcome.
local function remember(keys, args, status, used)
  redis.call('HSET', keys[3], args[1], status .. ':' .. used .. ':1000:0', '_', '')
end

-- A floor function: the clock and the redelivery lookup, then `commands`
-- (the op's own, returning the seats in use after it), the event, the
-- redelivery record and an outcome of the real one's size.
local function floor(status, kind, commands)
  return function(keys, args)
    local k, session = keys_of(keys[1]), args[4]
    local now = now_ms()
    local at = string.format('%d', now)
    local worker = looked_up(keys, args)
    local used = commands(keys, args, k, session, at)
    event(keys, k, kind, session, used, '1000', at)
    if worker then
      remember(keys, args, status, used)
    end
    return {status, used, 1000, 0, now, false, 1, 0, 0, 0, 0}
  end
end

redis.register_function('seatgate_floor_acquire', floor('ACQUIRED', 'acquired', function(keys, args, k, session, at)
  redis.call('HGET', k.sessions, session)
  redis.call('EXISTS', k.queue, k.deadlines)
  redis.call('HGETALL', keys[1])
  redis.call('HGET', k.revocations, session)
  local used = redis.call('ZCARD', k.holders) + 1
  redis.call('ZADD', k.holders, at, session)
  redis.call('HSET', k.sessions, session, at .. ':0:' .. args[8])
  return used
end))

redis.register_function('seatgate_floor_release', floor('RELEASED', 'released', function(keys, _, k, session)
  redis.call('HGET', k.sessions, session)
  redis.call('HGETALL', keys[1])
  redis.call('HGET', k.owners, 's:' .. session)
  redis.call('ZREM', k.holders, session)
  redis.call('HDEL', k.sessions, session)
  redis.call('EXISTS', k.queue, k.deadlines)
  return redis.call('ZCARD', k.holders)
end))
