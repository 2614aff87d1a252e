--[[
  reply: append one reply to the caller's reply stream, trim it by age and
  keep it expiring.

  KEYS[1]  the caller's reply_to stream (any slot; one key, so cluster-safe).
           The worker only ever names a key inside replies.prefix.

  ARGV[1]  keep_ms: replies younger than this are never trimmed, however many
           there are; older ones are (XADD MINID ~ on this server's clock)
  ARGV[2]  idle expiry of the reply stream, ms (at least keep_ms, so the
           stream outlives its newest reply by at least that)
  ARGV[3..] field, value, field, value, ... of the reply

  Returns the new entry id, or the error `WRONGTYPE` when KEYS[1] exists and is
  not a stream: then nothing is written, and no expiry is set on the key.

  Trimming by age, never by count: a client with thousands of requests in
  flight on one stream finds every reply. Entry ids carry this server's clock
  at XADD, and MINID is taken from the same clock, so a reply is trimmed only
  once it is older than keep_ms; `~` trims whole stream nodes only, so some
  older entries may stay a little longer, never fewer.
]]
local rcall = redis.call
local key = KEYS[1]
local kind = rcall('TYPE', key)['ok']
if kind ~= 'stream' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE reply_to is a ' .. kind .. ', not a stream')
end
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local oldest = now - tonumber(ARGV[1])
local id = rcall('XADD', key, 'MINID', '~', oldest, '*', unpack(ARGV, 3))
rcall('PEXPIRE', key, ARGV[2])
return id
