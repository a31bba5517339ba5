-- SPDX-License-Identifier: MIT
-- A key's state read by the scripts that decide (a piece of
-- src/store/redis/step_decide.lua and lean.lua, after their DECLINE): the
-- key's hash read with HMGET (v: the version, s: the state).  A key that
-- is not a hash is no state of ours: {2}, reported and never written.  A
-- version that is not 0 or 1 to 19 digits without a leading zero declines
-- (docs/redis.md, "Versions": the client reports it, its load reading the
-- version by the same rule); then no version, version 0 or no state
-- is a new key (cur[1] false, st nil), as the client's load reads it.
-- vtop: a version that cannot move on (2^63 - 1 or more, where HINCRBY
-- stops: a tampered key) starts again from TIME, as a new key's; the
-- state stays.
local cur = redis.pcall('HMGET', KEYS[1], 'v', 's')
if cur.err ~= nil then
  if string.find(cur.err, 'WRONGTYPE', 1, true) then return {2} end
  return redis.error_reply(cur.err)
end
local st = cur[2]
if cur[1] and cur[1] ~= '0' and
   (#cur[1] > 19 or not string.find(cur[1], '^[1-9]%d*$')) then
  return DECLINE
end
if cur[1] == false or cur[1] == '0' or st == false then
  cur[1] = false
  st = nil
end
local vtop = cur[1] and #cur[1] == 19 and cur[1] >= '9223372036854775807'
