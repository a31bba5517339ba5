-- SPDX-License-Identifier: MIT
-- An in-flight limit's acquire with the policy's rate limits, all or
-- nothing, in one script (docs/leases.md, "Leases on Redis"; the store
-- contract's lease() with rate limits, include/ratelimit_store.h): the
-- lease step (src/store/redis/lease.lua) and the general rate step
-- (src/store/redis/step.lua), each included whole as the body of a
-- function of its own KEYS and ARGV, so that their locals and their
-- returns stay theirs.  RATELIMIT.LEASESTEP (redis-module/) makes the same
-- three steps in C, with the same arguments, reply and bytes.
--
-- KEYS[1]  the key's leases, KEYS[2] its rate state (one hash tag)
-- ARGV     [1..9] the lease script's arguments (the op 'a'), then the
--          general step's, from its time on
-- returns  the lease script's five, then the step's reply, or 0 when the
--          class had no room (the rate limits not asked); an error when
--          KEYS[1] and KEYS[2] are one key
--
-- The steps: a count of the leases (expired ones dropped, as always);
-- with no room for the class, the acquire (denied: its retry time, nothing
-- more written); else the rate step, and only if it admits, the acquire
-- (granted: the class had room, and nothing ran in between).  A rate
-- denial, or a step that declines, leaves the leases as the count left
-- them.
local function lease_step(KEYS, ARGV)
--@include src/store/redis/lease.lua
end
local function rate_step(KEYS, ARGV)
--@include src/store/redis/step.lua
end

local largs = {}
for i = 1, 9 do largs[i] = ARGV[i] end
local rargs = {}
for i = 10, #ARGV do rargs[i - 9] = ARGV[i] end
-- One key for both: refused, as RATELIMIT.LEASESTEP refuses it (the
-- leases and the rate state would overwrite each other).
if KEYS[1] == KEYS[2] then
  return redis.error_reply('ERR lease: lease_key and rate_key are the same key')
end
if largs[1] ~= 'a' then
  return redis.error_reply('ERR lease: an acquire with rate limits only')
end
local lkey, rkey = {KEYS[1]}, {KEYS[2]}

largs[1] = 'c'
local c = lease_step(lkey, largs)
if c.err or c[1] ~= 0 then
  if not c.err then c[6] = 0 end
  return c -- malformed arguments, or not a lease state: nothing asked
end
largs[1] = 'a'
local limit = tonumber(largs[3]) -- N, or N - reserve for a normal request
if largs[5] ~= '1' then limit = limit - tonumber(largs[4]) end
if c[3] >= limit then
  local a = lease_step(lkey, largs) -- denied: when the class gets a slot
  if not a.err then a[6] = 0 end
  return a
end
local d = rate_step(rkey, rargs)
if d.err then return d end
if d[1] ~= 1 or d[2] ~= 1 then
  c[6] = d -- denied, declined or no hash: no lease, the count's answer
  return c
end
local a = lease_step(lkey, largs)
if not a.err then a[6] = d end
return a
