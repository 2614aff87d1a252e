--[[
  group_map: `seatgate license groups L set USER GROUP` and `unset USER`:
  puts a user in a group of the license's group map (K.groups, keys.lua),
  or takes it out, and records the change's `groups_changed` event
  (includes/admin.lua) in the same atomic step.

  KEYS[1]  the license record (only its key: the group map is derived from
           it, keys.lua; the license need not exist)
  KEYS[2]  where its events go (includes/events.lua)
  ARGV[1]  the license id, ARGV[2] the events retention, ms (events.lua)
  ARGV[3]  the actor
  ARGV[4]  the user; ARGV[5] its group, or '' to take the user out

  Returns the user's group before the call, or false (nil) when it was in
  none. A call that changes nothing (the same group again, a user out of
  the map taken out) records no event.
  Records one `groups_changed` event (before and after: {user: group},
  `{}` on the side where the user was in no group) when it changes the map.
]]
local rcall = redis.call
--- @include "keys"
--- @include "clock"
--- @include "admin"

local user, group = ARGV[4], ARGV[5]
local old = rcall('HGET', K.groups, user)
if (old or '') == group then
  return old
end
if group == '' then
  rcall('HDEL', K.groups, user)
else
  rcall('HSET', K.groups, user, group)
end
local side = function(g)
  if not g or g == '' then
    return '{}'
  end
  return cjson.encode({[user] = g})
end
EV.license, EV.keep_ms = ARGV[1], tonumber(ARGV[2])
admin_event('groups_changed', ARGV[3], side(old), side(group), now_ms())
return old
