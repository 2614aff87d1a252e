--[[
  keys: the KEYS of the seat scripts, by name.

  All of them carry the hash tag {L} of one license, so they live in one
  Redis Cluster slot. src/engine/keys.rs names them (the one Rust source
  of key names); the scripts are handed one and derive the others.
    KEYS[1]  seat:{L}:license    HASH  seats_total, expires_at_ms, active,
                                       heartbeat_timeout_ms?, queue_max?,
                                       policy? and the policy fields (policy.lua)
  and, in K by the name after `seat:{L}:`:
             seat:{L}:holders    ZSET  session -> last heartbeat (ms); its size
                                       is the seats in use, its low end the stale
             seat:{L}:sessions   HASH  session -> session record (session_record.lua)
             seat:{L}:queue      ZSET  waiting session -> priority and arrival (queue.lua)
             seat:{L}:waiters    HASH  waiting session -> waiter record (waiter_record.lua)
             seat:{L}:deadlines  ZSET  waiting session -> give-up time (ms)
             seat:{L}:alive      ZSET  waiting session -> when it is stale unless it
                                       shows it is alive again (ms; queue.lua)
             seat:{L}:queue_seq  STRING arrival counter
             seat:{L}:outbox     HASH  note id -> outbox record (outbox.lua):
                                       queue replies not yet delivered
             seat:{L}:owners     HASH  seats held per user and group, and the
                                       owner record of a session (owners.lua)
             seat:{L}:lingering  ZSET  released session whose seat lingers -> linger end (ms)
             seat:{L}:borrowed   ZSET  session holding a borrowed seat -> borrow end (ms)
  and, in the same slot, derived from KEYS[1] (bind_keys, below), never passed:
    seat:{L}:done:<b>   HASH  request key -> dedupe record (dedupe.lua), and '_' -> its mark,
                              for requests placed in time bucket b (expires);
                              acquire, release, heartbeat and revoke take the
                              bucket's key as KEYS[3] (K.done) and the one
                              before it as KEYS[4] (K.done_before: where an
                              earlier delivery may have stored the request's
                              reply; KEYS[3] again when none can)
    seat:{L}:hits:<S>   STRING the session's recent request counts
                              (rate_limit.lua; expires): K.license_rate
                              .. ':' .. session
    seat:{L}:hits       STRING the license's recent request counts (expires):
                              K.license_rate
    seat:{L}:revoked    ZSET  revoked session -> when it is forgotten (ms)
    seat:{L}:revocations HASH revoked session -> revocation record
                              (revoked.lua); both keys expire
    seat:{L}:groups     HASH  user -> group: the license's group map
                              (policy.lua); written by provisioning
    seat:{L}:denials    HASH  the license's denial window (denial_sample.lua)
    seat:{L}:event_seq  STRING the license's event counter (events.lua)
    seat:{L}:deleted    HASH  `at` -> when the license was last deleted (ms;
                              deleted.lua); expires a day later. A heartbeat
                              or release of a session of a license without a
                              record says license_deleted while it is there
  Every seat script (acquire, release, heartbeat, revoke, reap,
  delete_license) takes KEYS[1], the license record, and KEYS[2], where its
  events go (events.lua: on one node the events shard, on a cluster the
  license's own log, in its slot); the request scripts KEYS[3..4] too.

  Deriving the keys (issue 24): two to four KEYS instead of 17 to 21, and
  a key is built only when the call uses it (K's metatable). Redis 7 lets
  a script or function touch keys it did not declare; on a cluster they
  must lie in the slot of the declared ones, which the hash tag {L} makes
  so (tests/it/cluster.rs). src/engine/keys.rs stays the one Rust source of
  key names; tests/it/scripts.rs checks that these are the same.
]]
local K
-- The license's keys' common part, `seat:{L}:`.
local key_base
-- K's field names whose key is not `key_base .. name`.
local KEY_NAME = {license_rate = 'hits'}
-- A license key asked for the first time in a call: derived, kept in K.
local KEY_META = {__index = function(k, name)
  local key = key_base .. (KEY_NAME[name] or name)
  k[name] = key
  return key
end}
-- The license id, from KEYS[1]: what its hash tag holds. The last one
-- found is kept (in the function library, from call to call: a Lua string
-- compares by identity, so the same license costs one comparison).
local id_base, id_of_base
local function license_id()
  if key_base ~= id_base then
    id_base, id_of_base = key_base, string.match(key_base, '{([^}]*)}:$')
  end
  return id_of_base
end

-- The K of each license seen, by its record's key, with the keys derived
-- so far and `key_base` as [0]. In the function library they are kept from
-- call to call, so a license's keys are derived once, not on every call;
-- at most KEYED_MAX licenses are kept, past that the cache starts afresh.
-- 4,096, not fewer: a service with more licenses in use than the cap keeps
-- missing it (measured over 1,000 licenses, a direct call 192.5 thousand
-- instructions with a cap of 256, 176.3 with this one); this cache and
-- license.lua's hold about 2.6 KB a license between them, some 11 MB of
-- the functions' Lua memory when full (INFO's used_memory_vm_functions).
local KEYED_MAX = 4096
local keyed, keyed_count = {}, 0

-- Binds K to this call's KEYS. Run first by every entry point that
-- includes this file (the on_call line below: in the function library,
-- its function's prologue; in a script run on its own, here).
local function bind_keys()
  local license = KEYS[1]
  local k = keyed[license]
  if not k then
    if keyed_count >= KEYED_MAX then
      keyed, keyed_count = {}, 0
    end
    k = setmetatable({[0] = string.sub(license, 1, -8), license = license}, KEY_META)
    keyed[license], keyed_count = k, keyed_count + 1
  end
  key_base = k[0]
  -- The dedupe buckets are the call's own (absent for reap and delete_license).
  k.done, k.done_before = KEYS[3], KEYS[4]
  K = k
end
--- @on_call "bind_keys"
