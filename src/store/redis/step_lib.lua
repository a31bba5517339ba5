-- SPDX-License-Identifier: MIT
-- The general step's helpers and the algorithms' rules (a piece of
-- src/store/redis/step.lua and src/store/redis/fair.lua; docs/redis.md, "How the
-- scripts are made"): integers and times over doubles, the state's bytes,
-- expiries.
--@include lua_range.lua
local function fdiv(a, b) -- floor(a / b), 0 <= a < 2^51, 0 < b < 2^51
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) -- ceil(a / b), same ranges
  local q = fdiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- Little-endian unsigned 64-bit (and 32-bit) integers from the state bytes;
-- nil when the value is lim (an algorithm's NAME_STEP, <= 2^52) or more.
-- A value past 2^53 rounds, but never to below lim: the comparison holds.
local function u32(s, i)
  local a, b, c, d = string.byte(s, i, i + 3)
  return a + b * 256 + c * 65536 + d * 16777216
end
local function u64(s, i, lim)
  local lo, hi = u32(s, i), u32(s, i + 4)
  local x = hi * 4294967296 + lo
  if x >= lim then return nil end
  return x
end
local function i64(s, i, lim) -- signed, -lim <= x < lim
  local lo, hi = u32(s, i), u32(s, i + 4)
  if hi < 2147483648 then
    local x = hi * 4294967296 + lo
    if x >= lim then return nil end
    return x
  end
  local m = (4294967295 - hi) * 4294967296 + (4294967296 - lo)
  if m > lim then return nil end -- below -lim
  return -m
end
-- `count` little-endian bytes of x (0 <= x < 2^53); with flip, each byte
-- complemented (255 - b), which writes -(x + 1) in two's complement.
local function le(x, count, flip)
  local t = {}
  for k = 1, count do
    local b = x % 256
    t[k] = string.char(flip and 255 - b or b)
    x = (x - b) / 256
  end
  return table.concat(t)
end
local function put64(x) return le(x, 8, false) end
local function put32(x) return le(x, 4, false) end
local function puti64(x) -- signed, |x| < 2^53
  if x < 0 then return le(-x - 1, 8, true) end
  return le(x, 8, false)
end

-- Times: {s, ns}.  From the 8 state bytes (nil at 2^63 or more), by long
-- division of four 16-bit limbs by 10^9; and back.
local E9 = 1000000000
local function get_t(str, i)
  local b = {string.byte(str, i, i + 7)}
  local limbs = {b[7] + b[8] * 256, b[5] + b[6] * 256, b[3] + b[4] * 256,
                 b[1] + b[2] * 256}
  if limbs[1] >= 32768 then return nil end
  local r, q = 0, 0
  for k = 1, 4 do
    local cur = r * 65536 + limbs[k]
    local d = fdiv(cur, E9)
    r = cur - d * E9
    q = q * 65536 + d
  end
  return {q, r}
end
local function put_t(t)
  local limbs, carry, x = {}, 0, t[1]
  for k = 1, 4 do
    local sl = x % 65536
    x = (x - sl) / 65536
    local cur = sl * E9 + carry
    limbs[k] = cur % 65536
    carry = (cur - limbs[k]) / 65536
  end
  carry = t[2]
  for k = 1, 4 do
    local cur = limbs[k] + carry
    limbs[k] = cur % 65536
    carry = (cur - limbs[k]) / 65536
  end
  local out = {}
  for k = 1, 4 do
    out[2 * k - 1] = string.char(limbs[k] % 256)
    out[2 * k] = string.char((limbs[k] - limbs[k] % 256) / 256)
  end
  return table.concat(out)
end
local function tcmp(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] and -1 or 1 end
  if a[2] ~= b[2] then return a[2] < b[2] and -1 or 1 end
  return 0
end
local function tdiff(a, b) -- a - b for a >= b: a number, or math.huge
  local ds = a[1] - b[1]
  if ds >= 1048576 then return math.huge end
  return ds * E9 + (a[2] - b[2])
end
local function tminus(a, d) -- a - d for d < 2^50; nil below zero
  local ds = fdiv(d, E9)
  local s, ns = a[1] - ds, a[2] - (d - ds * E9)
  if ns < 0 then ns = ns + E9; s = s - 1 end
  if s < 0 then return nil end
  return {s, ns}
end
-- The window holding t: {a, b} (compare both), and the offset e in it.
local function window(t, W)
  if W % E9 == 0 then
    local ws = W / E9
    local k = fdiv(t[1], ws)
    return {k, 0}, (t[1] - k * ws) * E9 + t[2]
  end
  if E9 % W == 0 then
    local j = fdiv(t[2], W)
    return {t[1], j}, t[2] - j * W
  end
  return nil
end
local function next_window(k, W)
  if W % E9 == 0 or k[2] + 1 == E9 / W then return {k[1] + 1, 0} end
  return {k[1], k[2] + 1}
end
local function same(a, b) return a[1] == b[1] and a[2] == b[2] end

-- The key expires no sooner than `us` microseconds after Redis's own
-- clock (TIME, a reply {s, us}), whatever clock the caller's decision went
-- by: PEXPIREAT at the end rounded up to whole milliseconds, plus one.
-- Redis drops a key once its millisecond clock (its microsecond clock
-- rounded down, or a snapshot taken earlier) is past the expiry, so the
-- rounding up alone keeps it to the end; the extra millisecond keeps it
-- there also where a server drops the key on reaching the expiry.  A
-- duration is at most 2^51 us (71 years): the sum stays exact.
local function expire_at(key, us, tm)
  if us > 2251799813685248 then us = 2251799813685248 end
  local e = tonumber(tm[1]) * 1000000 + tonumber(tm[2]) + us
  local ms = math.floor(e / 1000)
  if ms * 1000 > e then ms = ms - 1 elseif (ms + 1) * 1000 <= e then ms = ms + 1 end
  if ms * 1000 < e then ms = ms + 1 end
  redis.call('PEXPIREAT', key, string.format('%.0f', ms + 1))
end

-- The algorithms' rules (src/algo/NAME.lua: tb_load, tb_advance, ... in
-- the shape of the C tables), over the helpers above: the build puts each file's
-- text here (cmake/lua_script.cmake).
--@include src/algo/token_bucket.lua
--@include src/algo/leaky_bucket.lua
--@include src/algo/fixed_window.lua
--@include src/algo/sliding_window.lua
--@include src/algo/sliding_log.lua
-- A reservation's debt bound, 2^62 scaled tokens (RATE__DEBT_MAX): never
-- reached within TOKEN_BUCKET_STEP, as in C.
local DEBT = 4611686018427387904

