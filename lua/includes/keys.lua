--[[
  keys: the KEYS of the seat scripts, by name.

  All of them carry the hash tag {L} of one license, so they live in one
  Redis Cluster slot. src/engine/keys.rs builds them; src/engine/scripts.rs
  passes them in this order.
    KEYS[1]  seat:{L}:license    HASH  seats_total, expires_at_ms, active,
                                       heartbeat_timeout_ms?, queue_max?,
                                       policy? and the policy fields (policy.lua)
    KEYS[2]  seat:{L}:holders    ZSET  session -> last heartbeat (ms); its size
                                       is the seats in use, its low end the stale
    KEYS[3]  seat:{L}:sessions   HASH  session -> session record (session_record.lua)
    KEYS[4]  seat:{L}:queue      ZSET  waiting session -> priority and arrival (queue.lua)
    KEYS[5]  seat:{L}:waiters    HASH  waiting session -> waiter record (queue.lua)
    KEYS[6]  seat:{L}:deadlines  ZSET  waiting session -> give-up time (ms)
    KEYS[7]  seat:{L}:queue_seq  STRING arrival counter
    KEYS[8]  seat:{L}:outbox     HASH  note id -> outbox record (outbox.lua):
                                       queue replies not yet delivered
    KEYS[9]  seat:{L}:owners     HASH  seats held per user and group, and the
                                       owner record of a session (owners.lua)
    KEYS[10] seat:{L}:lingering  ZSET  released session whose seat lingers -> linger end (ms)
    KEYS[11] seat:{L}:borrowed   ZSET  session holding a borrowed seat -> borrow end (ms)
  acquire, release, heartbeat and revoke also take
    KEYS[12] seat:{L}:done:<b>   HASH  request key -> dedupe record (dedupe.lua),
                                       for requests placed in time bucket b (expires)
    KEYS[13] seat:{L}:hits:<S>   STRING the session's recent request counts
                                       (rate_limit.lua; expires)
    KEYS[14] seat:{L}:hits       STRING the license's recent request counts (expires)
    KEYS[15] seat:{L}:done:<b-1> HASH  the bucket before KEYS[12], where an
                                       earlier delivery may have stored the
                                       request's reply; KEYS[12] again when none can
    KEYS[16] seat:{L}:revoked    ZSET  revoked session -> when it is forgotten (ms)
    KEYS[17] seat:{L}:revocations HASH revoked session -> revocation record
                                       (revoked.lua); both keys expire
  acquire alone also takes
    KEYS[18] seat:{L}:groups     HASH  user -> group: the license's group map
                                       (policy.lua); written by provisioning
  Every seat script takes last (after these) the events' three keys, the
  license's denial window (denial_sample.lua), its event counter and where
  its events go (events.lua, as EV.denials, EV.seq and EV.log:
  KEYS[#KEYS-2], KEYS[#KEYS-1], KEYS[#KEYS]). reap takes only KEYS[1..11]
  before them, delete_license KEYS[1..13]: the names of K past those are
  then other keys, never used by those scripts.
]]
local K
-- Binds K to this call's KEYS. Run first by every entry point that
-- includes this file (the on_call line below: in the function library,
-- its function's prologue; in a script run on its own, here).
local function bind_keys()
  K = {
    license = KEYS[1], holders = KEYS[2], sessions = KEYS[3], queue = KEYS[4],
    waiters = KEYS[5], deadlines = KEYS[6], queue_seq = KEYS[7], outbox = KEYS[8],
    owners = KEYS[9], lingering = KEYS[10], borrowed = KEYS[11],
    done = KEYS[12], session_rate = KEYS[13], license_rate = KEYS[14], done_before = KEYS[15],
    revoked = KEYS[16], revocations = KEYS[17], groups = KEYS[18],
  }
end
--- @on_call "bind_keys"
