--[[
  unlock: delete a lock only if we still own it (the lock may have expired and
  been taken by another process meanwhile).

  KEYS[1]  the lock key
  ARGV[1]  our token
  Returns 1 when deleted, 0 when someone else owns it now (or nobody does).
]]
local rcall = redis.call
if rcall('GET', KEYS[1]) == ARGV[1] then
  return rcall('DEL', KEYS[1])
end
return 0
