--[[
  remove_consumer: remove a consumer from a group only while it holds no
  pending entry, in one step.

  XINFO CONSUMERS, then XGROUP DELCONSUMER as two commands would race a read:
  an XREADGROUP landing between them hands the consumer entries, and
  DELCONSUMER then drops them from the pending list, where nobody can claim
  them any more. Checked and deleted in one script, nothing can land between.

  KEYS[1]  the requests stream (shard); the only key, so cluster-safe
  ARGV[1]  the consumer group
  ARGV[2]  the consumer

  Returns 1 when the consumer is gone (removed now, or it did not exist), 0
  when it holds pending entries and was left alone. A missing group is the
  error NOGROUP.
]]
local rcall = redis.call
local held = rcall('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #held > 0 then
  return 0
end
rcall('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
