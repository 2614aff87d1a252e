--[[
  revoked: what the scripts remember of revocations, K.revoked and K.revocations
  (keys.lua), so that a revoked session hears SESSION_REVOKED rather than
  SESSION_NOT_ACTIVE, and a cooldown keeps it from taking a seat again.

    K.revoked      ZSET  session -> when its revocation is forgotten (ms)
    K.revocations  HASH  session -> the revocation record, JSON:
      {"reason", "actor", "at", "cooldown_until"}
        reason          why, as the administrator wrote it
        actor           who revoked it
        at              when (Redis clock, ms)
        cooldown_until  until when its acquires are refused (ms); 0 = no cooldown
  Rust reads the record with engine::revocation::Revocation.
  A user-wide cooldown (revoke.lua, cooldown_scope=user) is an entry of its
  own under USER_REVOCATION .. <user>, never a session id (ids never contain
  '|'): acquire.lua refuses that user's acquires, whatever the session.

  Bounded memory: revoke.lua writes an entry that is forgotten
  max(remember_ms, cooldown) after the revocation, drops up to 100 entries
  already forgotten on each call, and keeps at most `max` per license
  (dropping the soonest forgotten first). Both keys expire when their last
  entry is forgotten, so a license nobody revokes on again holds none. The
  other scripts only look up the session at hand (nothing on a holder's
  heartbeat) and forget its entry when it is stale or the session acquires
  again (acquire.lua's cooldown_of).
]]
--- @include "keys"

-- The revocation entry of a user-wide cooldown is this followed by the user.
local USER_REVOCATION = 'user|'

local function forget_revocation(session)
  rcall('ZREM', K.revoked, session)
  rcall('HDEL', K.revocations, session)
end

-- The revocation record of `session` (its JSON, as stored) while it is
-- remembered, else nil.
local function revocation_of(session, now)
  local forget_at = tonumber(rcall('ZSCORE', K.revoked, session))
  if not forget_at then
    return nil
  end
  local raw = rcall('HGET', K.revocations, session)
  if forget_at <= now or not raw then
    forget_revocation(session)
    return nil
  end
  return raw
end
