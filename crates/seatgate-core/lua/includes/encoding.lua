--[[
  encoding: a hash or ZSET of a license made one of Redis's hashed
  encodings for good, where its compact one would be searched entry by
  entry on every request.

  Redis keeps a small hash or ZSET as a listpack (up to
  hash-max-listpack-entries 512 fields, zset-max-listpack-entries 128
  members, with values no longer than the *-max-listpack-value settings) and
  finds a field or member in it by reading it from the start: about 120
  instructions an entry, so a lookup that misses reads all of them. The
  dedupe buckets (dedupe.lua), the holders, sessions and owners of a
  license with many holders (session_record.lua), the waiters of a long
  queue (acquire.lua) and the due index (due_claim.lua) are read that way
  by every request that touches them. A
  hash or ZSET turns into a hashtable or skiplist for good (Redis never
  turns it back) when a value longer than its *-max-listpack-value is
  written to it; these helpers write one and take it away again in the same
  call, so the long value never stays, and reaches the AOF and the replicas
  once a key.
]]

-- Longer than any *-max-listpack-value seatgate's docs set or suggest (Redis's
-- default 64, ops/redis.conf's hash-max-listpack-value 256). The value, 1,024
-- '_', is no session id (ids are at most 128 bytes, with no '_'), so the
-- ZSET member added and taken out is never a holder.
local PAST_LISTPACK_BYTES = 1024
-- Built on first use: the library's builtins do not exist while it loads.
local past_listpack

local function past_listpack_value()
  past_listpack = past_listpack or string.rep('_', PAST_LISTPACK_BYTES)
  return past_listpack
end

-- Whether `key` is a listpack. A Redis user that may not run OBJECT
-- ENCODING (an ACL written before seatgate called it) gets false: the key
-- stays as it is, slower, and nothing fails.
local function is_listpack(key)
  return redis.pcall('OBJECT', 'ENCODING', key) == 'listpack'
end

-- Makes hash `key` a hashtable, writing `field` = `value` (a field the
-- caller writes anyway) with the long value first, in one HSET.
local function hset_as_hashtable(key, field, value)
  rcall('HSET', key, field, past_listpack_value(), field, value)
end

-- Makes hash `key`, which exists, a hashtable: writes field '' (no field
-- seatgate writes: every field of a hash that gets here is a session id or
-- has a prefix, never empty) and deletes it again.
local function hash_as_hashtable(key)
  rcall('HSET', key, '', past_listpack_value())
  rcall('HDEL', key, '')
end

-- Makes ZSET `key` a skiplist: adds a member too long for a listpack and
-- takes it out again.
local function zset_as_skiplist(key)
  local member = past_listpack_value()
  rcall('ZADD', key, '0', member)
  rcall('ZREM', key, member)
end
