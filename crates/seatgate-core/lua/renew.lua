--[[
  renew: take a lock that nobody holds, or keep one we hold, for ARGV[2] ms.
  The reaper's pass lock is sticky: the process holding it (the reaper
  leader) renews it on every scheduled pass and keeps it until it stops or
  dies, so one process runs the passes and exports the shared-state metrics.
  Compare-and-set, like lua/unlock.lua: a lock that expired and was taken by
  another process is never renewed by the old holder.

  KEYS[1]  the lock key
  ARGV[1]  our token
  ARGV[2]  lock lifetime, ms
  Returns 1 when we hold the lock now (taken or renewed), 0 when another does.
]]
local rcall = redis.call
local holder = rcall('GET', KEYS[1])
if holder == false then
  rcall('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  rcall('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
