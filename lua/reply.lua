--[[
  reply: append one reply to the caller's reply stream and keep it expiring.

  KEYS[1]  the caller's reply_to stream (any slot; one key, so cluster-safe)

  ARGV[1]  MAXLEN (approximate) of the reply stream
  ARGV[2]  idle expiry of the reply stream, ms
  ARGV[3..] field, value, field, value, ... of the reply

  Returns the new entry id, or the error `WRONGTYPE` when KEYS[1] exists and is
  not a stream: then nothing is written, and no expiry is set on somebody
  else's key.
]]
local rcall = redis.call
local key = KEYS[1]
local kind = rcall('TYPE', key)['ok']
if kind ~= 'stream' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE reply_to is a ' .. kind .. ', not a stream')
end
local id = rcall('XADD', key, 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, 3))
rcall('PEXPIRE', key, ARGV[2])
return id
