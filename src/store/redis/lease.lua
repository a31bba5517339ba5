-- SPDX-License-Identifier: MIT
-- The lease step (src/lease/step.c) in Lua, for the Redis store's lease()
-- without the module: the same bytes, in one round trip (docs/leases.md,
-- "Internals"; the contract: include/ratelimit_store.h, lease()).
-- Times and ids are 8-byte little-endian strings: a double cannot hold
-- them, so they are compared as two 32-bit halves and copied as bytes.
-- KEYS[1]: the key's hash (v: version, s: state).  ARGV: op (a acquire,
-- r release, e extend, c count), now, max, reserve, critical (0 or 1),
-- id, expires, pid (4 bytes), ttl (-1: until the latest expiry, 0: no
-- expiry, else microseconds).  Reply: {code (0 ok, 1 not held, 2 expired,
-- 3 not a lease state), granted, held, retry_at, latest}.
local function u32(s, i)
  local a, b, c, d = string.byte(s, i, i + 3)
  return ((d * 256 + c) * 256 + b) * 256 + a
end
-- The high and low halves of the u64 at s[i..i+7].
local function u64(s, i)
  return u32(s, i + 4), u32(s, i)
end
local function below(ah, al, bh, bl)
  return ah < bh or (ah == bh and al < bl)
end
local function le32(n)
  local b = {}
  for i = 1, 4 do
    b[i] = n % 256
    n = (n - b[i]) / 256
  end
  return string.char(b[1], b[2], b[3], b[4])
end

local ZERO8 = string.rep('\0', 8)
local op, now = ARGV[1], ARGV[2]
local max, reserve = tonumber(ARGV[3]), tonumber(ARGV[4])
local critical = ARGV[5] == '1'
local id, expires, pid = ARGV[6], ARGV[7], ARGV[8]
if #now ~= 8 or #id ~= 8 or #expires ~= 8 or #pid ~= 4 or not max or
   not reserve or max < 1 or max > 10000 or reserve < 0 or reserve >= max or
   not tonumber(ARGV[9]) then
  return redis.error_reply('ERR lease: malformed arguments')
end
local nh, nl = u64(now, 1)
local function reply(code, granted, held, retry, latest)
  return {code, granted and 1 or 0, held, retry or ZERO8, latest or ZERO8}
end

local got = redis.call('HMGET', KEYS[1], 'v', 's')
local ver, st = got[1], got[2]
-- A version is 0 or 1 to 19 digits without a leading zero (docs/redis.md,
-- "Versions"); anything else is no key of ours.
if ver and ver ~= '0' and
   (#ver > 19 or not string.find(ver, '^[1-9]%d*$')) then
  return reply(3, false, 0)
end
-- No version, version 0 or no state: a new key (as the client's load).
local fresh = not ver or ver == '0' or not st
local old = {}
if not fresh then
  if #st < 14 or st:byte(14) ~= 76 or st:byte(13) ~= 0 then
    return reply(3, false, 0)
  end
  local n = u32(st, 9)
  if n > 10000 or #st ~= 14 + 24 * n then return reply(3, false, 0) end
  for i = 0, n - 1 do
    local e = st:sub(15 + 24 * i, 38 + 24 * i)
    if e:sub(1, 8) == ZERO8 or e:byte(21) > 1 then
      return reply(3, false, 0)
    end
    old[i + 1] = e:sub(1, 21) .. '\0\0\0' -- as the step writes an entry
  end
end

-- The live entries; an expired one is dropped for good.
local live, changed = {}, false
for i = 1, #old do
  local eh, el = u64(old[i], 9)
  if below(nh, nl, eh, el) then live[#live + 1] = old[i] else changed = true end
end

local granted, retry = false, nil
if op == 'a' then
  local limit = critical and max or max - reserve
  if #live >= limit then
    -- When this class gets a slot back: the (held - limit + 1)-th
    -- earliest expiry (more than one under a reserve, or when an object
    -- of a larger N filled the key).
    local k = #live - limit + 1
    local t = {}
    for i = 1, #live do t[i] = live[i]:sub(9, 16) end
    table.sort(t, function(x, y)
      local xh, xl = u64(x, 1)
      local yh, yl = u64(y, 1)
      return below(xh, xl, yh, yl)
    end)
    retry = t[k]
  else
    live[#live + 1] = id .. expires .. pid .. (critical and '\1' or '\0') ..
                      '\0\0\0'
    granted, changed = true, true
  end
elseif op == 'r' or op == 'e' then
  local at = nil
  for i = 1, #live do
    if live[i]:sub(1, 8) == id then at = i break end
  end
  if at == nil then
    for i = 1, #old do
      if old[i]:sub(1, 8) == id then return reply(2, false, 0) end
    end
    local xh, xl = u64(expires, 1)
    if not below(nh, nl, xh, xl) then return reply(2, false, 0) end
    return reply(1, false, 0)
  end
  if op == 'r' then
    live[at] = live[#live]
    live[#live] = nil
  else
    live[at] = id .. expires .. live[at]:sub(17, 24)
  end
  changed = true
elseif op ~= 'c' then
  return redis.error_reply('ERR lease: unknown op')
end

local latest, lh, ll = ZERO8, 0, 0
for i = 1, #live do
  local eh, el = u64(live[i], 9)
  if below(lh, ll, eh, el) then latest, lh, ll = live[i]:sub(9, 16), eh, el end
end
if not changed then return reply(0, granted, #live, retry, latest) end

-- A new key's version (no version, zero, or no state) starts from TIME
-- in microseconds, as the module's and the rate step's do, and so does
-- one that cannot move on (2^63 - 1 or more, where HINCRBY stops).
local t = redis.call('TIME')
if fresh or (#ver == 19 and ver >= '9223372036854775807') then
  redis.call('HSET', KEYS[1], 'v', string.format('%.0f', t[1] * 1000000 + t[2]))
else
  redis.call('HINCRBY', KEYS[1], 'v', 1)
end
redis.call('HSET', KEYS[1], 's',
           latest .. le32(#live) .. '\0L' .. table.concat(live))
local ttl = tonumber(ARGV[9])
if ttl < 0 then
  -- Until the latest expiry (the step's time-to-live), in whole us, at
  -- least 1; past 2^53 ns the double is a hair short: the ms rounding
  -- and the extra ms below cover it.
  local ns = 0
  if below(nh, nl, lh, ll) then ns = (lh - nh) * 4294967296 + (ll - nl) end
  ttl = math.ceil(ns / 1000)
  if ttl < 1 then ttl = 1 end
end
if ttl > 0 then
  if ttl > 2251799813685248 then ttl = 2251799813685248 end
  local e = tonumber(t[1]) * 1000000 + tonumber(t[2]) + ttl
  local ms = math.floor(e / 1000)
  if ms * 1000 < e then ms = ms + 1 end
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', ms + 1))
else
  redis.call('PERSIST', KEYS[1])
end
return reply(0, granted, #live, retry, latest)
